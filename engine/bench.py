"""`specchat bench`: tokens/s, speedup against our own plain decoding, mean accepted, peak memory,
with peers measured in the same run on the same prompts and settings.

Honesty rules: warm-up generations are excluded; every strategy runs every prompt; tokens/s
excludes model loading and prompt prefill for every engine and is otherwise wall-clock time (ours:
the decode loop, every step's bookkeeping included; for transformers ``generate()`` we time a
1-token generate of the same prompt and subtract it: (n - 1) / (t_n - t_1)); greedy runs check
that every strategy emitted exactly the tokens of our ``ar`` (a difference is a warning and exit
1); the peers decode greedily, so ``--compare`` takes ``--temperature 0`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SpecchatError
from .generate import reset_peak_rss, run_generation, window_peak_rss_mb
from .loading import dtype_flag

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "bench.json"


@dataclass
class Row:
    strategy: str
    engine: str
    prompt: str
    tokens_per_s: float
    speedup: float
    mean_accepted: float | None  # None where the peer does not report it
    peak_mem_mb: float
    new_tokens: int
    identical: bool | None = None
    acceptance: float | None = None  # accepted / drafted tokens (None: nothing drafted, or a peer)

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "engine": self.engine, "prompt": self.prompt, "tokens_per_s": round(self.tokens_per_s, 2),
                "speedup": round(self.speedup, 3), "mean_accepted": round(self.mean_accepted, 3) if self.mean_accepted is not None else None, "peak_mem_mb": round(self.peak_mem_mb, 1),
                "new_tokens": self.new_tokens, "identical_to_ar": self.identical,
                "acceptance": round(self.acceptance, 3) if self.acceptance is not None else None}


MAX_PROMPTS_BYTES = 64 << 20


def load_prompts(path: str | Path | None) -> list[dict[str, str]]:
    from .registry import read_small

    p = Path(path) if path else DEFAULT_PROMPTS
    if not p.exists():
        raise SpecchatError(f"{p}: prompts file not found")
    try:
        text = read_small(p, "prompts file", MAX_PROMPTS_BYTES, SpecchatError).decode("utf-8-sig")  # a BOM is fine
    except UnicodeDecodeError as e:
        raise SpecchatError(f"{p}: not UTF-8 text ({e})") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecchatError(f"{p}: invalid JSON ({e})") from None
        if not isinstance(data, list):
            raise SpecchatError(f"{p}: expected a JSON list of {{\"text\": ...}} objects, got {type(data).__name__}")
        for i, x in enumerate(data):  # which entry is wrong, and a blank text as the .txt reader's blank line
            if not (isinstance(x, dict) and isinstance(x.get("text"), str)):
                raise SpecchatError(f"{p}: entry {i + 1} is not a {{\"text\": ...}} object with a string text")
            if not x["text"].strip():
                raise SpecchatError(f"{p}: entry {i + 1} has an empty text (nothing to measure)")
        out = [{"text": x["text"], "name": x.get("name") or f"p{i}"} for i, x in enumerate(data)]
    else:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        out = [{"text": ln, "name": f"p{i}"} for i, ln in enumerate(lines)]
    if not out:
        raise SpecchatError(f"{p}: no prompts")
    return _unique_names(out)


def _unique_names(prompts: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each prompt's name made unique (``code``, ``code#2``): bench keys our ``ar``'s output and
    rate by name (the peers' speedup and identical columns read them), and ALL / MEDIAN name the
    summary rows."""
    seen = {"ALL", "MEDIAN"}
    for p in prompts:
        name, k = p["name"], 1
        while name in seen:
            k += 1
            name = f"{p['name']}#{k}"
        seen.add(name)
        p["name"] = name
    return prompts


LLAMA_CPP_NAMES = ("llama.cpp", "llama-cpp", "llamacpp")  # --compare's names for the llama.cpp peer


def cmd_bench(args: argparse.Namespace) -> int:
    from .cli import load_session, strategy_from_args

    from .strategy import from_spec

    if args.prompt_ids:  # the one prompt, as token ids (a checkpoint without a tokenizer)
        from .cli import parse_prompt_ids

        if args.prompts:
            raise SpecchatError("give --prompts or --prompt-ids, not both")
        prompts = [{"name": "ids", "text": "", "ids": parse_prompt_ids(args.prompt_ids)}]
    else:
        prompts = load_prompts(args.prompts)
    if args.strategy is not None and args.strategies is not None:  # --strategy was ignored, silently
        raise SpecchatError(f"give --strategies (bench's list) or --strategy, not both (got --strategy {args.strategy!r} "
                            f"and --strategies {args.strategies!r})")
    # `bench --strategy sd:7` measured the default ar,pld and nothing of sd:7: one spec is a list of one
    listed = args.strategies if args.strategies is not None else (args.strategy or "ar,pld")
    args.strategies, args.strategy = listed, None
    names = [s.strip() for s in listed.split(",") if s.strip()]
    if not names:  # `--strategies ","` measured the ar baseline alone, silently
        raise SpecchatError(f"--strategies {args.strategies!r} names no strategy (e.g. ar,pld:auto,sd:5)")
    asked_peers = [x.strip() for x in (args.compare or "").split(",") if x.strip()]
    for peer in asked_peers:  # a typo fails before the model's seconds of loading, not after
        if peer != "transformers" and peer not in LLAMA_CPP_NAMES:
            raise SpecchatError(f"--compare {peer!r}: unknown peer (transformers, llama.cpp)")
    if args.max_new_tokens < 1:
        raise SpecchatError(f"--max-new-tokens must be at least 1 to measure anything, got {args.max_new_tokens}")
    if asked_peers and args.max_new_tokens < 2:  # (n - 1) / (t_n - t_1): a peer's first token holds its prefill
        raise SpecchatError("--compare needs --max-new-tokens 2 or more (a peer's rate leaves out its first token, "
                            "which carries its prefill)")
    if asked_peers and args.temperature > 0:
        raise SpecchatError("--compare measures the peers' greedy decoding: run it with --temperature 0 "
                            f"(got --temperature {args.temperature:g}: our sampled rows against their greedy ones)")
    if asked_peers and getattr(args, "repeat_penalty", 1.0) != 1.0:
        raise SpecchatError("--compare measures the peers' plain greedy decoding: run it without --repeat-penalty "
                            f"(got {args.repeat_penalty:g}: our penalised rows against their unpenalised ones)")
    for spec in names:  # a typo fails before the peer's minutes
        try:
            from_spec(spec)  # (with its @bridge: "pld@" failed only after the model loaded)
        except ValueError as e:
            raise _spec_error(spec, e) from None
    early_llama = llama_cpp_first(args, prompts)  # before our model loads (see there)
    session = load_session(args)
    peers = _check_peers(args.compare, session)  # before the long part: a bad --compare fails at once
    if args.ignore_eos:
        session.decoder.eos_ids = set()
    # speedups are against our own plain decoding, measured here, first on every prompt
    names = ["ar"] + [n for n in names if n != "ar"]
    strategies = []
    labels = {}
    seen: dict[str, int] = {}
    for spec in names:
        s = _strategy_of_spec(spec, args, session.has_drafter, strategy_from_args)
        _check_bridge(spec, s, session)
        strategies.append(s)
        # a spec given twice (an A/A run, to see the noise) is a strategy of its own: `pld,pld` merged
        # both into one label, the ALL row summing their tokens and times
        seen[spec] = seen.get(spec, 0) + 1
        labels[id(s)] = spec if seen[spec] == 1 else f"{spec}#{seen[spec]}"
    encoded = []
    for p in prompts:
        if "ids" in p:
            ids = p["ids"]
        else:
            ids = session.encode_chat([{"role": "user", "content": p["text"]}]) if not args.raw else session.tokenizer.encode(p["text"])
        encoded.append((p["name"], ids))
    dec = session.decoder
    for name, ids in encoded:  # before the minutes of measuring, not when this prompt's turn comes
        if len(ids) >= dec.context_length:
            from .errors import ContextOverflowError

            raise ContextOverflowError(f"prompt {name!r} is {len(ids)} tokens but the context holds {dec.context_length}; "
                                       "shorten it or raise --max-context")
    N = args.max_new_tokens

    # each strategy keeps its own cost gate from prompt to prompt, as one chat session would (the
    # calibration it learns carries over, engine/gate.DraftGate.carried), never another strategy's
    gates: dict[int, object] = {}

    def run_as(s, ids, n):
        dec.reset()
        dec.gate = gates[id(s)].carried() if gates.get(id(s)) is not None else None
        if (s.name in ("mab", "optimal") or s.adaptive) and dec.verify_cost is None:
            dec.calibrate()  # once per run, what the first step would do: outside the clock (warm-up's work)
        # the decode loop's wall clock, prefill left out: the steps' own ms leave out the work
        # between their timed parts (bookkeeping, detokenizing, the event: ~3% on SmolLM2 q8),
        # which a reader waits through and the peers' clocks include
        t0 = time.perf_counter()
        evs, summ = run_generation(dec, ids, s, n)
        summ.decode_s = max(0.0, time.perf_counter() - t0 - summ.prefill_s) if summ.new_tokens else 0.0
        gates[id(s)] = dec.gate
        return evs, summ

    rows: list[Row] = []
    ar_out: dict[str, list[int]] = {}
    ar_tps: dict[str, float] = {}
    totals: dict[tuple[str, str], list[float]] = {}
    done = 0  # prompts every strategy has run: Ctrl-C keeps their rows (a prompt cut midway would
    # compare the strategies over different prompts, so its rows are left out)
    left_out = ""  # what Ctrl-C left out, for its message
    try:
        for _ in range(max(0, args.warmup)):  # warm-up: allocator, caches, lazy init — excluded
            for s in strategies:
                run_as(s, encoded[0][1], min(N, 16))

        # Interleaved: every strategy on a prompt before the next prompt, ar first (its output is the
        # reference), so a slow minute of a busy machine falls on all strategies alike, not on one.
        for name, ids in encoded:
            left_out = " (the one cut midway is left out)"
            prompt_rows, prompt_totals = [], []
            for s in strategies:
                reset_peak_rss()  # each row's peak is its own run's, not the process's so far
                evs, summ = run_as(s, ids, N)  # same cold-prefix conditions for every strategy
                out = [t for e in evs for t in e.emitted]
                if s.name == "ar":
                    ar_out[name], ar_tps[name] = out, summ.tokens_per_s
                identical = (out == ar_out.get(name)) if s.greedy else None
                label = labels[id(s)]
                prompt_rows.append(Row(label, "specchat", name, summ.tokens_per_s, summ.tokens_per_s / ar_tps[name] if ar_tps.get(name) else 0.0,
                                       summ.mean_accepted, window_peak_rss_mb(), summ.new_tokens, identical,
                                       summ.accepted / summ.drafted if summ.drafted else None))
                prompt_totals.append((label, [summ.new_tokens, summ.decode_s, summ.steps, summ.drafted, summ.accepted]))
                _progress(f"{label:>8} {name:<12} {summ.tokens_per_s:7.1f} tok/s  mean acc {summ.mean_accepted:.2f}")
            rows += prompt_rows
            for label, add in prompt_totals:
                t = totals.setdefault((label, "specchat"), [0.0, 0.0, 0.0, 0.0, 0.0])
                for i, x in enumerate(add):
                    t[i] += x
            done += 1
            left_out = ""
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False

    order = {labels[id(s)]: i for i, s in enumerate(strategies)}
    rows.sort(key=lambda r: order[r.strategy])  # the table groups each strategy's prompts (a stable sort)
    peer_info: dict[str, dict[str, Any]] = {}  # each peer's version and dtype, for --json's settings
    try:
        for peer in peers if not interrupted else ():
            left_out = f" (the {peer} peer's rows are left out)"
            if peer == "transformers":
                rows += _bench_transformers(session, encoded, N, args, ar_tps, ar_out, totals, info=peer_info)
            else:
                rows += _bench_llama_cpp(session, encoded, N, args, ar_tps, ar_out, totals, early=early_llama, info=peer_info)
    except KeyboardInterrupt:  # in a peer's run: ours and the peers' before it are measured; its rows so far are dropped
        interrupted = True  # (a peer's rows join `rows` once its run returns: the rows there are whole)
        kept = {r.engine for r in rows}
        totals = {k: v for k, v in totals.items() if k[1] in kept}
        peer_info = {k: v for k, v in peer_info.items() if k in kept}

    ar_total = totals.get(("ar", "specchat"))
    ar_rate = ar_total[0] / ar_total[1] if ar_total and ar_total[1] else 0.0
    summary = []
    for (sname, engine), (ntok, secs, steps, drafted, accepted) in totals.items():
        rate = ntok / secs if secs else 0.0
        # the most of its rows' peaks (ours: each row's own run; a peer's: its child process's)
        mem = max((r.peak_mem_mb for r in rows if r.strategy == sname and r.engine == engine), default=0.0)
        # the tokens the rows say (a peer's rate counts n - 1 a prompt: its first token holds its prefill)
        emitted = sum(r.new_tokens for r in rows if r.strategy == sname and r.engine == engine)
        summary.append(Row(sname, engine, "ALL", rate, rate / ar_rate if ar_rate else 0.0, (ntok / steps if steps else 0.0) if engine == "specchat" else None, mem, emitted,
                           all(r.identical for r in rows if r.strategy == sname and r.engine == engine and r.identical is not None) if engine == "specchat" and strategies[0].greedy else None,
                           accepted / drafted if drafted else None))
    # and the median over prompts of each per-prompt figure: one degenerate reply (a run of one
    # digit that prompt lookup drafts four tokens a step) moved an ALL ratio by 0.06x once
    for sname, engine in totals:
        per = [r for r in rows if r.strategy == sname and r.engine == engine]
        if not per:
            continue
        # a peer's prompt ended at its first token has no rate (0.0): not a figure to take the median of
        per = [r for r in per if engine == "specchat" or r.new_tokens > 1] or per
        acc = [r.mean_accepted for r in per if r.mean_accepted is not None]
        rates = [r.acceptance for r in per if r.acceptance is not None]
        whole = next(r for r in summary if r.strategy == sname and r.engine == engine)
        summary.append(Row(sname, engine, "MEDIAN", statistics.median(r.tokens_per_s for r in per), statistics.median(r.speedup for r in per),
                           statistics.median(acc) if acc else None, whole.peak_mem_mb, int(statistics.median(r.new_tokens for r in per)),
                           whole.identical, statistics.median(rates) if rates else None))
    if args.json and (rows or interrupted):  # (interrupted before a prompt was done: an empty run a script can read)
        res = {"rows": [r.to_json() for r in rows + summary],
               "settings": _settings(session, args, done, [labels[id(s)] for s in strategies], peer_info,
                                     {labels[id(s)]: s.to_dict() for s in strategies})}
        print(json.dumps({**res, "interrupted": True} if interrupted else res))
    elif rows:
        _print_table(rows + summary, session, args, done)
    # every strategy is lossless: a greedy row whose tokens differ from our ar's is a bug, said
    # loudly and in the exit status (a peer's tokens may differ: other kernels, other rounding)
    differ = [f"{r.strategy} on {r.prompt}" for r in rows if r.engine == "specchat" and r.identical is False]
    if differ:
        print(f"specchat: warning: greedy tokens differ from our ar's (every strategy should be lossless): "
              f"{', '.join(differ)}", file=sys.stderr)
    if interrupted:
        print(f"specchat: interrupted: {done} of {len(encoded)} prompts measured{left_out}", file=sys.stderr)
        from .cli import EXIT_INTERRUPTED

        return EXIT_INTERRUPTED
    return EXIT_MISMATCH if differ else 0


EXIT_MISMATCH = 1  # bench measured, but a strategy's greedy tokens differ from our ar's


def _check_peers(compare: str | None, session) -> list[str]:
    """The --compare list, each checked: known, its package importable, the target readable by it."""
    peers = []
    for peer in [x.strip() for x in (compare or "").split(",") if x.strip()]:
        if peer == "transformers":
            try:
                import transformers  # noqa: F401
            except ImportError:
                raise SpecchatError("--compare transformers needs the transformers package (pip install transformers)") from None
        elif peer in LLAMA_CPP_NAMES:
            peer = "llama.cpp"
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                raise SpecchatError("--compare llama.cpp needs llama-cpp-python (pip install -e '.[peers]' or pip install llama-cpp-python)") from None
            if session.target.fmt != "gguf":
                raise SpecchatError("--compare llama.cpp needs a GGUF target (llama.cpp reads GGUF files only)")
        else:
            raise SpecchatError(f"--compare {peer!r}: unknown peer (transformers, llama.cpp)")
        peers.append(peer)
    return peers


def _strategy_of_spec(spec: str, args: argparse.Namespace, has_drafter: bool, strategy_from_args):
    """A --strategies entry: NAME, or NAME:PARAM to compare variants in one run —
    ``tree:3-2-2-1-1`` (shape), ``sd:4`` / ``pld:8`` (draft length), ``optimal:24`` (node budget);
    ``@tli`` / ``@slem`` / ``@slrs`` / ``@union`` picks the vocabulary bridge (``sd:5@slrs``)."""
    from .strategy import from_spec

    name, _, param = spec.partition("@")[0].partition(":")
    args.strategy = name
    if name == "ar":  # the baseline, which bench adds itself: --vocab and a drafter's verifier are the
        # other rows' (`--vocab slem` or `--verify mss` refused every run, naming plain decoding)
        kept = args.vocab, args.verify
        args.vocab = None
        if args.verify not in (None, "auto", "greedy", "race"):
            args.verify = None
        try:
            s = strategy_from_args(args, has_drafter)
        finally:
            args.vocab, args.verify = kept
    else:
        s = strategy_from_args(args, has_drafter)
    if not param and "@" not in spec:
        return s
    try:
        return from_spec(spec, s).validate(has_drafter)
    except ValueError as e:
        raise _spec_error(spec, e) from None


def _check_bridge(spec: str, s, session) -> None:
    """A vocabulary bridge asked for (``sd:4@slrs``, ``--vocab tli``) with a drafter model that shares
    the target's vocabulary: there is nothing to bridge, and the row (labelled with the bridge) ran
    without one. Refused, as --vocab with pld or ar is."""
    from .cli import check_bridge

    try:
        check_bridge(s, session)
    except SpecchatError as e:
        raise SpecchatError(f"--strategies {spec!r}: {e}") from None


def _spec_error(spec: str, e: ValueError) -> SpecchatError:
    """A --strategies entry's error, in one line naming the entry (StrategyError's own text names it)."""
    msg = str(e)
    return SpecchatError(msg if msg.startswith("strategy ") else f"--strategies {spec!r}: {msg}")


def _datastore_of(session) -> str | None:
    """The n-gram datastore pld:auto / hybrid drafted from (None: prompt lookup alone)."""
    return getattr(session, "datastore", None)


def _drafter_of(session) -> dict[str, Any] | None:
    d = getattr(session, "drafter", None)
    if d is None:
        return None
    return {"name": d.name, "path": str(Path(d.path).resolve()), "description": d.description,
            "bridged": bool(getattr(session.decoder, "bridged", False))}


def _settings(session, args, n_prompts: int, strategies: list[str] | None = None,
              peers: dict[str, dict[str, Any]] | None = None,
              strategy_settings: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """What a run's numbers depend on, to reproduce it: a row's label alone (``sd``) left out the
    --draft-len, --verify, --vocab... it ran with, and the datastore pld:auto drafted from."""
    import platform

    import torch

    from .cli import parse_prompt_ids

    return {"target": session.description, "drafter": _drafter_of(session), "datastore": _datastore_of(session),
            "max_context": args.max_context, "context_length": session.decoder.context_length,
            "prompt_ids": parse_prompt_ids(args.prompt_ids) if getattr(args, "prompt_ids", None) else None,
            "strategy_settings": strategy_settings or {},
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "top_p": getattr(args, "top_p", None), "top_k": getattr(args, "top_k", None), "min_p": getattr(args, "min_p", None),
            "repeat_penalty": getattr(args, "repeat_penalty", None), "repeat_last_n": getattr(args, "repeat_last_n", None),
            "seed": getattr(args, "seed", None),
            "ignore_eos": bool(getattr(args, "ignore_eos", False)), "raw": bool(getattr(args, "raw", False)),
            "strategies": strategies, "prompts_file": str(args.prompts) if getattr(args, "prompts", None) else None,
            "prompts": n_prompts, "dtype": session.target.compute_flag, "dtype_arg": args.dtype, "warmup": args.warmup,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "threads": _threads(), "kernels": _kernels(getattr(session.target, "model", None)),
            "chain_scorer": _scorer_meta(session), "peers": peers or {}, "machine": _machine(),
            "python": platform.python_version(), "torch": torch.__version__, "commit": _commit()}


def _machine() -> dict[str, Any]:
    """The CPU measured on (speeds differ several-fold between machines: compare ratios within one run)."""
    import platform

    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu": model or platform.processor() or None, "arch": platform.machine(), "cpus": os.cpu_count() or 0,
            "system": platform.system()}


def _commit() -> dict[str, Any] | None:
    """The checkout's commit and whether tracked files were changed (None outside a git checkout)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10)
        return {"sha": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return None


def _scorer_meta(session) -> dict[str, Any] | None:
    """What hybrid:K's mixed chains were ranked by: the drafter's chain scorer (where it was fitted),
    or None for the gate's calibration bins (engine/chain_scorer.py)."""
    sc = getattr(getattr(getattr(session, "drafter", None), "model", None), "chain_scorer", None)
    return None if sc is None else {"fitted_on": sc.meta.get("fitted_on"), "positions": sc.meta.get("positions")}


def _kernels(model=None) -> dict[str, str]:
    """Which CPU kernels this run used (they are chosen per machine): oneDNN packing per dtype,
    the C attention and the C row-consistent fp32 linear (engine/native), which kernel runs the
    bf16 and q8 compute types' products (AMX / AVX-512 BF16 / AVX2 / scalar; VNNI / AVX2 / scalar) and,
    for a target with a bf16 KV cache in the C pass, its attention (AMX tiles / vector)."""
    import torch

    from . import native
    from .models import common

    return {"packed_fp32": str(common.packs(torch.float32)), "packed_bf16": str(common.packs(torch.bfloat16)),
            "native": native.status(), "native_linear": common.native_linear_status(),
            "bf16_products": native.bf16_path(), "q8_products": native.a8_path(),
            **({"bf16_cache_attention": native.attention_path(model.cfg.head_dim)}
               if getattr(model, "kv_bf16", False) and hasattr(getattr(model, "cfg", None), "head_dim") else {})}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _print_table(rows: list[Row], session, args, n_prompts: int) -> None:
    print(f"target: {session.description}; {n_prompts} prompts x {args.max_new_tokens} new tokens, T={args.temperature:g}; "
          f"{_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print("kernels: " + ", ".join(f"{k} {v}" for k, v in _kernels(getattr(session.target, "model", None)).items()))
    print(f"{'strategy':<16} {'engine':<13} {'prompt':<12} {'tok/s':>8} {'speedup':>8} {'mean acc':>9} {'acc rate':>8} {'peak MB':>8} {'same as ar':>10}")
    for r in rows:
        same = "" if r.identical is None else ("yes" if r.identical else "NO")
        rate = "-" if r.acceptance is None else f"{r.acceptance:.2f}"
        print(f"{r.strategy:<16} {r.engine:<13} {r.prompt:<12} {r.tokens_per_s:8.1f} {r.speedup:7.2f}x {('-' if r.mean_accepted is None else f'{r.mean_accepted:.2f}'):>9} {rate:>8} {r.peak_mem_mb:8.0f} {same:>10}")


# transformers runs in a child process too, at OpenMP's own wait policy: in this process (the
# engine's PASSIVE default, right for its C passes, whose pool shares the cores with torch's team)
# generate() ran SmolLM2 bf16 at 16.5 tok/s against 24.9 under ACTIVE (2-core Zen 4, 2026-11-27),
# and under ACTIVE our C passes lost a third (95 -> 66 tok/s): one process cannot be fair to both.
_TRANSFORMERS_CHILD = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM
job = json.load(sys.stdin)
torch.set_num_threads(job["threads"])
dtype = getattr(torch, job["dtype"])
if job["gguf_file"]:
    model = AutoModelForCausalLM.from_pretrained(job["dir"], gguf_file=job["gguf_file"], dtype=dtype)
else:
    model = AutoModelForCausalLM.from_pretrained(job["dir"], dtype=dtype)
model.eval()
eos = job["eos"] or None
def timed(ids, n, extra):
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0] if eos else 0, **extra)
    return time.perf_counter() - t0, out[0, len(ids):].tolist()
timed(job["prompts"][0][1], 8, {})  # warm-up
for label, extra in (("ar", {}), ("pld", {"prompt_lookup_num_tokens": 10})):
    if extra:
        try:  # a variant transformers refuses for this model (prompt lookup on a stateful Mamba)
            timed(job["prompts"][0][1], 2, extra)
        except (ValueError, NotImplementedError, TypeError) as e:
            print(json.dumps({"skipped": label, "why": " ".join(str(e).split()) or type(e).__name__}), flush=True)
            continue
    for name, ids in job["prompts"]:
        t1, _ = timed(ids, 1, extra)
        tn, out = timed(ids, job["n"], extra)
        print(json.dumps({"label": label, "name": name, "out": out, "t1": t1, "tn": tn, "rss_mb": peak_mb()}), flush=True)
print(json.dumps({"version": __import__("transformers").__version__}), flush=True)
"""


# what every peer's child script can call: its own peak memory for its rows
_CHILD_PRELUDE = '''
def peak_mb():  # this process's own peak RSS (VmHWM; ru_maxrss starts from the parent's at exec)
    try:
        return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        return 0.0
'''


def _run_child(code: str, job: dict, peer: str) -> list[dict]:
    """A peer's child process (``code``, fed ``job`` as JSON on stdin) at OpenMP's own wait policy,
    whatever ours is; its JSON lines, the last one {"version": ...}."""
    import subprocess

    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)  # the peer's own default, its fastest (see _LLAMA_CPP_CHILD)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD_PRELUDE + code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:  # both pipes drained together: a chatty stderr cannot fill up and stall the child
        out, err = proc.communicate(json.dumps(job), timeout=6 * 3600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise SpecchatError(f"{peer} peer failed: no answer in 6 hours") from None
    try:
        results = [json.loads(line) for line in out.splitlines() if line.strip()]
    except ValueError:
        results = []
    if proc.returncode != 0 or not results or "version" not in results[-1]:
        raise SpecchatError(f"{peer} peer failed: {_child_failure(proc.returncode, err)}")
    return results


def _child_failure(code: int | None, err: str) -> str:
    """A peer child's failure in a line: its last line of stderr, or, where a signal killed it
    silently, which one. A llama-cpp-python built with GGML_NATIVE on an AMX Xeon KVM guest died of
    SIGILL at its first tile instruction (``tilezero``) with nothing on stderr (session 42): "no
    output" said nothing of why."""
    import signal

    last = (err.strip().splitlines() or [""])[-1][:200]
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = (" (an instruction this CPU lacks or does not grant: rebuild the package for this machine,"
                " e.g. CMAKE_ARGS=\"-DGGML_NATIVE=OFF ...\" with its CPU features named)") if name == "SIGILL" else ""
        return f"killed by {name}{hint}" + (f": {last}" if last else "")
    return last or (f"exit status {code}, no output" if code else "no output")


def _bench_transformers(session, encoded, N: int, args, ar_tps, ar_out, totals, info=None) -> list[Row]:
    """Hugging Face generate(): plain and prompt lookup, same model, dtype (the compute type's:
    bf16 for our bf16 C pass), prompts, N and thread count, in a child process at OpenMP's own
    wait policy (see _TRANSFORMERS_CHILD). The rate is (n - 1) / (t_n - t_1), prefill excluded."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SpecchatError("--compare transformers needs the transformers package (pip install transformers)") from None
    loaded = session.target
    gguf = loaded.fmt == "gguf"
    job = {"dir": str(loaded.path.parent if gguf else loaded.path), "gguf_file": loaded.path.name if gguf else None,
           "dtype": str(session.decoder.target.compute_dtype).replace("torch.", ""), "threads": _threads(),
           "eos": sorted(session.decoder.eos_ids), "n": N, "prompts": [[name, list(ids)] for name, ids in encoded]}
    results = _run_child(_TRANSFORMERS_CHILD, job, "transformers")
    version = results.pop()["version"]
    if info is not None:
        info["transformers"] = {"version": version, "dtype": dtype_flag(job["dtype"]), "threads": job["threads"]}
    rows = []
    for r in results:
        if "skipped" in r:
            print(f"specchat: note: transformers {r['skipped']} skipped: {r['why']}", file=sys.stderr)
            continue
        label, name, out, t1, tn = r["label"], r["name"], r["out"], r["t1"], r["tn"]
        n = len(out)
        rate = (n - 1) / (tn - t1) if n > 1 and tn > t1 else 0.0
        ident = out == ar_out.get(name) if args.temperature <= 0 else None
        rows.append(Row(label, "transformers", name, rate, rate / ar_tps[name] if ar_tps.get(name) else 0.0, None, r["rss_mb"], n, ident))
        t = totals.setdefault((label, "transformers"), [0.0, 0.0, 0.0, 0.0, 0.0])
        if rate > 0:  # measured: a prompt ended at its first token adds no rate, only noise
            t[0] += n - 1
            t[1] += tn - t1
            t[2] += n - 1
        _progress(f"{label:>8} {name:<12} {rate:7.1f} tok/s  (transformers, own process)")
    return rows


def cmd_draft_cost(args: argparse.Namespace) -> int:
    """`bench --draft-cost`: median ms for the drafter to propose a 5-token chain and a
    (3,2,2,1,1) tree (mamba-drafters §4.1: a recurrent drafter forks its state per child and runs
    one batched step per depth), each from a fresh root as in decoding. Issue [drafting] bounds
    tree/chain at 2.5x on this CPU."""
    import statistics

    import torch

    from .cli import load_session
    from .drafters.base import DraftRequest

    session = load_session(args)
    drafter = session.decoder.drafters.get("model")
    if drafter is None:
        raise SpecchatError("--draft-cost needs a drafter model (--drafter REF)")
    g = torch.Generator().manual_seed(0)
    history = torch.randint(0, session.decoder.target.vocab_size, (160,), generator=g).tolist()
    shapes = {"chain5": (1, 1, 1, 1, 1), "tree32211": (3, 2, 2, 1, 1)}
    out: dict[str, float] = {}
    repeats = 24
    for label, shape in shapes.items():
        drafter.reset()
        req = DraftRequest(shape=shape)
        samples = []
        for i in range(repeats + 4):
            h = history[: 120 + i]  # one new token per step, like decoding with nothing accepted
            t0 = time.perf_counter()
            drafter.propose(h, req)
            if i >= 4:  # warm-up excluded
                samples.append((time.perf_counter() - t0) * 1000.0)
        out[label] = statistics.median(samples)
    ratio = out["tree32211"] / out["chain5"]
    # the target's compute type as bench's settings name it (--dtype's words: q8, bf16, fp32): its
    # torch dtype said torch.float32 of a q8 target (the drafter itself runs in fp32 whatever the target's)
    res = {"drafter": session.drafter.description if session.drafter else "", "target": session.target.description,
           "target_dtype": session.target.compute_flag,
           "chain5_ms": round(out["chain5"], 3), "tree32211_ms": round(out["tree32211"], 3), "ratio": round(ratio, 3),
           "threads": _threads(), "repeats": repeats}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"drafter: {res['drafter']} beside target {res['target']}; {res['threads']} threads")
        print(f"chain of 5: {out['chain5']:.2f} ms · tree (3,2,2,1,1): {out['tree32211']:.2f} ms · ratio {ratio:.2f}x")
    return 0


# llama.cpp decodes in a child process: this one's OpenMP runtime (shared with llama.cpp's ggml)
# was loaded with the engine's OMP_WAIT_POLICY=PASSIVE default, under which llama.cpp decoded
# SmolLM2 at 41 tok/s against ~120 at its own defaults (2-core Zen 4 EPYC, 2026-11-25). The child
# imports llama_cpp alone, never the engine, at OpenMP's own wait policy whatever ours is: an
# OMP_WAIT_POLICY=ACTIVE given for our bf16 passes took it to 37 tok/s against 113 (2026-11-26).
_LLAMA_CPP_CHILD = r"""
import json, sys, time
import llama_cpp
job = json.load(sys.stdin)
llm = llama_cpp.Llama(model_path=job["path"], n_ctx=job["ctx"], n_threads=job["threads"], n_threads_batch=job["threads"],
                      n_batch=512, verbose=False, logits_all=False)
eos = set(job["eos"])
def run(ids, n):
    llm.reset()
    out, times = [], []
    for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        times.append(time.perf_counter())
        out.append(int(tok))
        if tok in eos or len(out) >= n:
            break
    return out, times
run(job["prompts"][0][1], 8)  # warm-up
for name, ids in job["prompts"]:
    out, times = run(ids, job["n"])
    print(json.dumps({"name": name, "out": out, "secs": times[-1] - times[0] if len(out) > 1 else 0.0, "rss_mb": peak_mb()}), flush=True)
print(json.dumps({"version": getattr(llama_cpp, "__version__", "?")}), flush=True)
"""


def _run_llama_cpp(path, eos, encoded, N: int) -> tuple[str, list[dict]]:
    """llama.cpp's greedy decoding of each prompt's ids: (its version, per prompt {name, out, secs})."""
    job = {"path": str(path), "ctx": max(len(ids) for _, ids in encoded) + N + 8, "threads": _threads(),
           "eos": sorted(eos), "n": N, "prompts": [[name, list(ids)] for name, ids in encoded]}
    results = _run_child(_LLAMA_CPP_CHILD, job, "llama.cpp")
    return results.pop()["version"], results


def llama_cpp_first(args, prompts) -> tuple[list, tuple[str, list[dict]]] | None:
    """llama.cpp's run before this process loads its model: our torch threads, once a parallel
    region has run, spin on a core under OMP_WAIT_POLICY=ACTIVE (what bf16 benches run with) for
    as long as the process lives, and the child decoded at 37 tok/s beside them against 113 (2-core
    Zen 4, 2026-11-26). The GGUF's tokenizer alone (read without running a parallel region) gives
    the same prompt ids as the session will. None where that does not apply (not a GGUF target,
    llama.cpp not asked for): then it runs after ours, as other peers do. Returns (encoded, result)."""
    if not any(p.strip() in LLAMA_CPP_NAMES for p in (args.compare or "").split(",")):
        return None
    from .gguf import load_gguf
    from .loading import resolve
    from .registry import load_registry
    from .session import chat_ids, default_target_name

    reg = load_registry(args.models)
    _, path = resolve(args.target or default_target_name(reg), reg)
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        return None
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None  # _check_peers says so once the session is loaded
    tok = load_gguf(path, defer=True).tokenizer
    if tok is None:
        return None
    encoded = [(p["name"], p["ids"] if "ids" in p else tok.encode(p["text"]) if args.raw
                else chat_ids(tok, [{"role": "user", "content": p["text"]}])) for p in prompts]
    eos = set() if args.ignore_eos else set(tok.eos_ids)
    return encoded, _run_llama_cpp(path, eos, encoded, args.max_new_tokens)


def _bench_llama_cpp(session, encoded, N: int, args, ar_tps, ar_out, totals, early=None, info=None) -> list[Row]:
    """llama.cpp (llama-cpp-python, the ``peers`` extra): plain greedy decoding of the same GGUF
    file (its own quantized kernels: the weights stay Q4_1 etc. and the activations are rounded to
    8 bits, as in our q8 type, so its tokens may differ from ours), same prompts (our
    chat-templated ids), same thread count, in a child process at llama.cpp's own OpenMP defaults,
    whatever OMP_WAIT_POLICY we run under, before our model loaded where it could (``early``, from
    ``llama_cpp_first``, used when its prompt ids are ours; see _LLAMA_CPP_CHILD). Prefill is
    excluded as for every engine: the clock starts at the first generated token and the rate is
    (n - 1) / (t_n - t_1)."""
    if early is not None and early[0] == encoded:
        version, results = early[1]
    else:
        version, results = _run_llama_cpp(session.target.path, session.decoder.eos_ids, encoded, N)
    if info is not None:
        info["llama.cpp"] = {"version": version, "weights": "the GGUF's own", "threads": _threads()}
    rows = []
    for r in results:
        name, out, secs = r["name"], r["out"], r["secs"]
        n = len(out)
        rate = (n - 1) / secs if n > 1 and secs > 0 else 0.0
        ident = out == ar_out.get(name) if args.temperature <= 0 else None
        rows.append(Row("ar", "llama.cpp", name, rate, rate / ar_tps[name] if ar_tps.get(name) else 0.0, None, r.get("rss_mb", 0.0), n, ident))
        t = totals.setdefault(("ar", "llama.cpp"), [0.0, 0.0, 0.0, 0.0, 0.0])
        if rate > 0:
            t[0] += n - 1
            t[1] += secs
            t[2] += n - 1
        _progress(f"{'ar':>8} {name:<12} {rate:7.1f} tok/s  (llama.cpp {version}, own process)")
    return rows
