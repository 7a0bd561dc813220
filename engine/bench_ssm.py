"""`specchat bench --tree-scaling`: the verify-side measurements of STree Table 1 and Snakes and
Ladders Table 3 on this machine.

1. Full binary trees of 15, 31 and 63 nodes: time and peak memory of one verify pass in
   ``stree`` mode (the packed tree, shared prefixes computed once) vs ``unrolled`` (every
   root-to-leaf path as its own chain, tokens repeated).
2. One draft of 6 tokens, all accepted: ms per step of ``ar`` (one token per step) and of the
   backtrack modes ``replay`` / ``joint`` / ``recompute`` (verify 7 rows + advancing the state).

Timings do not depend on weight values, so ``--target`` may be a bare config.json (or a directory
with only config.json): the model then gets random weights (built through transformers'
``from_config`` so names and shapes are exactly a checkpoint's), labelled as such.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .errors import SpecchatError
from .generate import unroll

SIZES = (15, 31, 63)


def binary_tree(nodes: int) -> list[int]:
    """Parents of the draft nodes of a full binary tree of ``nodes`` nodes counting the root token
    (STree Table 1's 2^d - 1 layout), in BFS order; -1 = child of the root."""
    parents = []
    for i in range(nodes - 1):
        parents.append(-1 if i < 2 else (i - 2) // 2)
    return parents


def random_model(config_path: Path, dtype: torch.dtype):
    """A model of our own from a config.json with random weights (timing only)."""
    from .loading import _families, build, read_config, read_config_file

    # the checks and messages of a model directory's config.json
    cfg = read_config(config_path) if config_path.is_dir() else read_config_file(config_path)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise SpecchatError("random-weight timing models need transformers (pip install transformers)") from None
    mt = cfg.get("model_type")
    if mt is None:
        raise SpecchatError(f"{config_path}: config needs a model_type for random weights")
    fams = _families()
    if mt not in fams:  # (transformers' own error lists every type it knows, hundreds)
        raise SpecchatError(f"{config_path}: unknown architecture model_type={mt!r} (supported: {', '.join(sorted(fams))})")
    torch.manual_seed(0)
    try:
        config = AutoConfig.for_model(**cfg)
        with torch.device("meta"):  # the size first: no memory is taken
            n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        _check_fits(config_path, cfg, n_params)
        sd = AutoModelForCausalLM.from_config(config).state_dict()
    except SpecchatError:
        raise
    except Exception as e:  # a value transformers' config classes reject that ours let through
        msg = (str(e).strip().splitlines() or [""])[0][:200]
        raise SpecchatError(f"{config_path}: transformers cannot build this config ({type(e).__name__}: {msg})") from None
    return build(cfg, sd, dtype, 4096, str(config_path))


def _check_fits(config_path: Path, cfg: dict, n_params: int) -> None:
    """Refuse a random-weight model that would not fit in memory: a config naming only its
    model_type takes transformers' defaults (llama's are 7B parameters), and building that in fp32
    (twice over: the model and our copy) took the machine's memory and the process died silently."""
    import psutil  # (a dependency: the app's memory line reads it too, app/sysinfo.py)

    need = n_params * 4 * 2
    avail = psutil.virtual_memory().available
    if need > avail // 2:
        sizes = "" if any(k in cfg for k in ("hidden_size", "d_model", "n_embd")) else \
            " (it gives no sizes: transformers' defaults for this model_type apply)"
        raise SpecchatError(f"{config_path}: a {n_params / 1e9:.1f}B-parameter model{sizes} needs ~{need / 2**30:.0f} GiB "
                            f"to build with random weights, more than half this machine's free memory "
                            f"({avail / 2**30:.0f} GiB); give smaller sizes (hidden_size, num_hidden_layers, vocab_size)")


@contextlib.contextmanager
def _without_profiler_chatter():
    """torch's profiler (kineto) writes a "USDT:... profiler_start/stop" line to stderr at every
    start and stop, six measurements' worth between the table's lines, and a warning for each block
    allocated before it started and freed during it (what the peak rightly leaves out): the
    process's stderr goes to a temporary file meanwhile, and every other line is written back."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (a test's capture): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not ln.startswith("USDT:") and "allocated before the profiling started" not in ln]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def peak_alloc_mb(fn) -> float:
    """Peak bytes live at once among the tensors ``fn`` allocates (torch profiler allocation events,
    replayed in time order). RSS cannot show this: the CPU allocator reuses pages it already has."""
    from torch.profiler import ProfilerActivity, profile

    with _without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:  # an op's figure includes its children's: count each allocation once
        live += e.cpu_memory_usage - sum(c.cpu_memory_usage for c in e.cpu_children)
        peak = max(peak, live)
    return peak / 2**20


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(samples)


def tree_scaling(model, repeats: int = 5, prefix: int = 64) -> list[dict[str, Any]]:
    """STree Table 1 analogue: one verify pass over full binary trees, stree vs unrolled."""
    g = torch.Generator().manual_seed(0)
    V = model.vocab_size
    model.allocate()
    model.prefill(torch.randint(0, V, (prefix,), generator=g).tolist())
    rows = []
    for n in SIZES:
        parents = [-1] + [p + 1 for p in binary_tree(n)]
        tokens = torch.randint(0, V, (n,), generator=g).tolist()
        u_tokens, u_parents, _ = unroll(tokens, parents)
        for mode, (tk, pa) in (("stree", (tokens, parents)), ("unrolled", (u_tokens, u_parents))):
            ms = _time(lambda: model.verify(tk, pa), repeats)
            mem = peak_alloc_mb(lambda: model.verify(tk, pa))
            rows.append({"mode": mode, "nodes": n, "rows": len(tk), "ms": round(ms, 2), "peak_mem_mb": round(mem, 1)})
    model.cache.clear_scratch()
    return rows


def backtrack_steps(model, draft: int = 6, repeats: int = 7, prefix: int = 64) -> list[dict[str, Any]]:
    """Snakes and Ladders Table 3 analogue: steady-state ms per step with one fully accepted draft
    of ``draft`` tokens, for each way of advancing the state, against one plain decoding step."""
    from .generate import Decoder
    from .strategy import preset
    from .tree import TokenTree

    g = torch.Generator().manual_seed(1)
    V = model.vocab_size
    base = torch.randint(0, V, (prefix,), generator=g).tolist()
    chain = torch.randint(0, V, (draft + 1,), generator=g).tolist()
    tree = TokenTree.chain(chain[:draft])
    dec = Decoder(model)
    rows = []
    for name in ("ar", "replay", "joint", "recompute"):
        s = preset("sd", draft_len=draft, backtrack=name if name != "ar" else "replay")
        dec.start(base)
        times = []
        for _ in range(repeats + 1):  # the first step is warm-up (and, for joint, has nothing to prepend)
            t0 = time.perf_counter()
            if name == "ar":
                model.verify([dec.history[-1]], [-1])
                model.commit([0])
                dec.history.append(chain[0])
            else:
                _, commit = dec._verify_pass(s, tree, dec.history[-1])
                commit(list(range(draft + 1)))  # every draft token accepted
                dec.history.extend(chain)
            times.append((time.perf_counter() - t0) * 1000.0)
        ms = statistics.median(times[1:])
        tokens = 1 if name == "ar" else draft + 1
        rows.append({"mode": name, "draft": 0 if name == "ar" else draft, "tokens_per_step": tokens, "ms_per_step": round(ms, 2)})
    return rows


def has_recurrent_state(model) -> bool:
    """Whether any of the model's layers keeps a recurrent (SSM) state (Mamba, Mamba-2, hybrids)."""
    from .ssm_cache import RecurrentCache

    cache = model.cache if model.cache is not None else model.new_cache(8)
    return isinstance(cache, RecurrentCache) or isinstance(getattr(cache, "ssm", None), RecurrentCache)  # a hybrid's


def _speed_line(nodes: int, stree_ms: float, unrolled_ms: float) -> str:
    """stree against unrolled in words that hold either way ("0.84x faster" was said of a slower one)."""
    r = unrolled_ms / stree_ms if stree_ms else float("inf")
    if r >= 1:
        return f"  {nodes} nodes: stree is {r:.2f}x faster than unrolled"
    return f"  {nodes} nodes: stree is {1 / r:.2f}x slower than unrolled"


def cmd_tree_scaling(args: argparse.Namespace) -> int:
    from .loading import dtype_flag, parse_dtype

    ref = Path(args.target) if args.target else None
    if ref is not None and (ref.suffix == ".json" or (ref.is_dir() and not any(ref.glob("*.safetensors")) and not any(ref.glob("*.bin")))):
        if args.dtype == "q8":  # parse_dtype's q8 is fp32: a q8 request measured fp32, silently
            raise SpecchatError("--dtype q8 multiplies a GGUF's quantised blocks; random weights have none (use fp32 or bf16)")
        model_type = None
        try:
            model_type = json.loads((ref / "config.json" if ref.is_dir() else ref).read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            pass  # random_model says what is wrong with the config
        dtype = parse_dtype(args.dtype, model_type=model_type if isinstance(model_type, str) else None)
        model, label = random_model(ref, dtype), f"{ref} (random weights, timing only)"
        compute = dtype_flag(dtype)
    else:
        from . import cli

        # the compute type as `bench` and `generate` load it: load() decides auto with the model's own
        # type (q8 for such a GGUF) and keeps q8's blocks; parse_dtype here turned q8 into fp32 and
        # auto into the probe's choice without the model
        loaded = cli.load_target(args, dtype=args.dtype, max_context=4096)
        model, label, compute = loaded.model, loaded.description, loaded.compute_flag
    scaling = tree_scaling(model)
    steps = backtrack_steps(model)
    # the backtrack modes are Snakes and Ladders' ways of advancing an SSM's state; on a model with
    # only a KV cache they still run (replay is the cache's compaction) but measure no SSM state
    ssm = has_recurrent_state(model)
    if args.json:
        print(json.dumps({"target": label, "dtype": compute, "threads": torch.get_num_threads(), "rows": scaling,
                          "backtrack": steps, "recurrent_state": ssm}))
        return 0
    print(f"target: {label}; {torch.get_num_threads()} threads, dtype {compute}")
    print(f"{'mode':<10} {'nodes':>5} {'rows':>5} {'ms':>9} {'peak MB':>8}")
    for r in scaling:
        print(f"{r['mode']:<10} {r['nodes']:>5} {r['rows']:>5} {r['ms']:>9.2f} {r['peak_mem_mb']:>8.1f}")
    for n in SIZES:
        a = next(r for r in scaling if r["mode"] == "stree" and r["nodes"] == n)
        b = next(r for r in scaling if r["mode"] == "unrolled" and r["nodes"] == n)
        print(_speed_line(n, a["ms"], b["ms"]))
    if not ssm:
        print("\nno SSM layers in this model: the backtrack modes below advance only its KV cache "
              "(replay is the cache's compaction), not an SSM state")
    print(f"\n{'backtrack':<10} {'tokens/step':>11} {'ms/step':>9} {'ms/token':>9}")
    for r in steps:
        print(f"{r['mode']:<10} {r['tokens_per_step']:>11} {r['ms_per_step']:>9.2f} {r['ms_per_step'] / r['tokens_per_step']:>9.2f}")
    return 0
