"""`specchat` command line (the CLI contract of issue 2; keep it stable).

    specchat [chat] [--target REF] [--drafter REF] [--strategy NAME] [--models FILE]
    specchat generate [options] [PROMPT]
    specchat bench [options]
    specchat models [--models FILE]

Errors print one line (``specchat: error: ...``) and exit 2; Ctrl-C during generate flushes the
partial output and exits 130; a reader that goes away (``| head``) ends the command quietly (141).
The chat command imports the UI lazily (the engine itself never imports textual).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader left (`| head`)


def _add_model_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="REF", help="models.toml name | HF-format dir | .gguf file | Hub id (default: the registry's default)")
    p.add_argument("--drafter", metavar="REF", help="REF | ngram | none (default: the registry's pairing for the target, else none)")
    p.add_argument("--models", metavar="FILE", help="models.toml to use (default: $SPECCHAT_MODELS or the shipped one)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16", "q8"], default="auto",
                   help="compute type; q8: a GGUF's Q4_1/Q8_0 products with 8-bit activations (integer dot products, as llama.cpp); "
                        "auto (default): the fastest a start-up micro-benchmark finds on this machine (q8 for such GGUFs where "
                        "the 8-bit products measure >= 20%% faster, as with AVX-512 VNNI or AVX2, bf16 where faster than fp32, "
                        "else fp32)")
    p.add_argument("--max-context", type=int, default=None, metavar="N", help="cap the context (KV cache rows; 0 or unset: the model's full context, up to 8192)")
    p.add_argument("--datastore", default=None, metavar="FILE",
                   help="n-gram datastore of the target's own replies that pld:auto continues its drafts from "
                        "(`specchat distill ngram`); none = prompt lookup only (default: the target's registry entry's)")


def _add_strategy_opts(p: argparse.ArgumentParser) -> None:
    from .strategy import BACKTRACK_MODES, SSM_TREE_MODES, STRATEGIES, VERIFIERS, VOCAB_BRIDGES

    p.add_argument("--strategy", default=None, metavar="NAME[:PARAM][:auto]",
                   help=f"{' | '.join(STRATEGIES)}, with bench's spec forms: sd:4, tree:3-2-1, pld:auto (cost-aware draft length)")
    p.add_argument("--draft-len", type=int, default=None, metavar="K")
    p.add_argument("--tree", default=None, metavar="SHAPE", help="static tree shape, e.g. 3,2,2,1,1")
    p.add_argument("--arms", default=None, metavar="S1;S2;...",
                   help="mab: tree shapes to choose among, e.g. '3,2,2,1,1;3,3,2,1;1,1,1,1,1'")
    p.add_argument("--lambda-ucb", type=float, default=None, metavar="L", help="mab: UCB exploration weight")
    p.add_argument("--node-budget", type=int, default=None, metavar="K", help="optimal: most draft nodes per step")
    p.add_argument("--verify", choices=VERIFIERS, default=None)
    p.add_argument("--vocab", choices=VOCAB_BRIDGES, default=None)
    p.add_argument("--ssm-tree", choices=SSM_TREE_MODES, default=None)
    p.add_argument("--backtrack", choices=BACKTRACK_MODES, default=None)
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 = greedy; values in (0, 1e-6) are refused (their softmax overflows: use 0)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus: the most likely tokens holding this much mass")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="the K most likely tokens only (0: off)")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P",
                   help="tokens at least P times as likely as the most likely one only (0: off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, metavar="R",
                   help="divide the logits of tokens seen in the last --repeat-last-n by R (1: off; greedy too)")
    p.add_argument("--repeat-last-n", type=int, default=64, metavar="N", help="the tokens of context the penalty looks back on")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed, a 64-bit integer")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text as is")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens (fixed-length runs)")
    p.add_argument("--prompt-ids", default=None, metavar="1,2,3", help="token ids in (checkpoints without a tokenizer)")


class _UsageError(Exception):
    """A command line argparse rejects: main prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line (``specchat generate: error: ... (see --help)``)
    instead of a usage block and a SystemExit."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise _UsageError(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="specchat", description="Chat with local models; speculative decoding shown live.")
    sub = ap.add_subparsers(dest="cmd")

    chat = sub.add_parser("chat", help="the chat TUI (default)")
    _add_model_opts(chat)
    chat.add_argument("--strategy", default=None, metavar="NAME[:PARAM][:auto]",
                      help="the strategy the app starts with, in bench's spec forms: pld, sd:4, tree:3-2-1, sd:auto "
                           "(default: the model pairing's best measured one)")
    chat.add_argument("--max-new-tokens", type=int, default=512)
    # sampling, over the first model's strategy (unset: the strategy's own, the saved one's)
    chat.add_argument("--temperature", type=float, default=None, metavar="T", help="0 = greedy")
    chat.add_argument("--top-p", type=float, default=None, metavar="P")
    chat.add_argument("--top-k", type=int, default=None, metavar="K")
    chat.add_argument("--min-p", type=float, default=None, metavar="P")
    chat.add_argument("--repeat-penalty", type=float, default=None, metavar="R")
    chat.add_argument("--repeat-last-n", type=int, default=None, metavar="N")
    chat.add_argument("--seed", type=int, default=None, metavar="S")
    chat.add_argument("--system", default=None, metavar="TEXT",
                      help="system prompt of the chats started in this run (default: the one set in the app, if any)")
    chat.add_argument("--keymap", default=None, metavar="FILE",
                      help="the keys to use instead of the defaults (TOML: binding id = key; default: $SPECCHAT_KEYMAP "
                           "or keymap.toml in the data directory; README: Keys)")

    gen = sub.add_parser("generate", help="stream a completion to stdout")
    _add_model_opts(gen)
    _add_strategy_opts(gen)
    gen.add_argument("prompt", nargs="?", default=None, help="prompt text (default: stdin)")
    gen.add_argument("--samples", type=int, default=None, metavar="N", help="N independent generations, seeds S..S+N-1")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end")
    gen.add_argument("--system", default=None, metavar="TEXT", help="a system prompt before PROMPT (chat template)")
    gen.add_argument("--stop", action="append", default=None, metavar="TEXT",
                     help="end the reply with the token that completes TEXT (kept in the output; repeatable; "
                          "a newline as $'\\n' in bash)")

    bench = sub.add_parser("bench", help="tokens/s, speedup vs ar, mean accepted, peak memory")
    _add_model_opts(bench)
    _add_strategy_opts(bench)
    bench.add_argument("--strategies", default=None, help="comma-separated strategies; NAME:PARAM for variants (tree:3-2-2-1-1, sd:4); "
                       "default ar,pld (--strategy SPEC alone: ar and SPEC)")
    bench.add_argument("--prompts", default=None, metavar="FILE", help=".json list of {\"text\"} or .txt lines")
    bench.add_argument("--compare", default=None, metavar="PEERS", help="comma-separated peers measured in the same run: transformers (plain generate() and prompt lookup, same dtype), llama.cpp (plain decoding of the same GGUF via llama-cpp-python)")
    bench.add_argument("--warmup", type=int, default=1, metavar="N", help="warm-up generations excluded from timing")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--verify-cost", action="store_true",
                       help="measure the target's verify cost t(n) for n = 1..32 rows and fit a + b*n + c*n^2")
    bench.add_argument("--draft-cost", action="store_true",
                       help="drafter time for a 5-token chain vs a (3,2,2,1,1) tree (needs --drafter)")
    bench.add_argument("--tree-scaling", action="store_true",
                       help="verify time/memory of stree vs unrolled on binary trees, and per-step cost of the backtrack modes; "
                            "--target may be a config.json (random weights, timing only)")

    from .distill import add_parser as add_distill

    add_distill(sub)

    dl = sub.add_parser("download", help="download a model (models.toml name or Hub id) into the Hugging Face cache; "
                        "Ctrl-C stops it and a re-run resumes")
    dl.add_argument("ref", metavar="REF")
    dl.add_argument("--models", metavar="FILE")
    dl.add_argument("--revision", default=None)
    dl.add_argument("--include", action="append", default=None, metavar="GLOB",
                    help="only files matching GLOB (repeatable), e.g. one .gguf of a repo with several")

    models = sub.add_parser("models", help="registry entries and whether each is available locally")
    models.add_argument("--models", metavar="FILE")
    models.add_argument("--json", action="store_true")
    return ap


HEADLESS = ("generate", "bench", "distill")


def cpu_busy(sample_s: float = 0.15) -> float:
    """How many cores are busy right now (other processes': this one has not started its work),
    over ``sample_s`` (psutil); the 1-minute load average where that cannot be read. The load
    average trails by minutes: a command started right after another one (`distill data && distill
    train`) read ~2 and took passive waits, at half the training speed (2-core Zen 4, 2026-11-27:
    4.5 s a step against 2.1 with active waits)."""
    import psutil  # no torch, no OpenMP: safe before the wait policy is set

    try:
        return (os.cpu_count() or 1) * psutil.cpu_percent(interval=sample_s) / 100.0
    except (OSError, psutil.Error):
        return os.getloadavg()[0]


def torch_bf16_native() -> bool:
    """Whether torch's own bf16 products run natively on this CPU (AVX-512 BF16 or AMX-BF16 among
    its flags), rather than converting bf16 in software (AVX2)."""
    from . import native

    return bool({"avx512_bf16", "amx_bf16"} & native.cpu_flags())


def spin_headless(cmd: str, dtype: str | None, environ, load1: float, torch_only: bool = False) -> bool:
    """Whether a command should switch torch's OpenMP threads to active waits (set before torch
    loads; an explicit OMP_WAIT_POLICY always wins). Only headless commands on an idle machine
    (< 0.5 cores busy, :func:`cpu_busy`: under any other load spinning collapses, engine/__init__.py), and only
    when every pass runs in torch (``torch_only``: `distill train`, a Mamba-2 trained in torch,
    twice as fast with active waits), the C kernels off, or bf16 where the bf16 C pass does not apply
    (no vector bf16 products: ``native.bf16_records_on``), where active waits are ~13% faster. Otherwise
    the C kernels' own pool (engine/native/pool.c) spins between regions and torch's actively
    spinning team would take its second core: SmolLM2 ar 126.8 tok/s passive vs 32.9 active
    (bench/results/2026-11-25-pool.md); bf16 C pass 95 vs 66 (bench/results/2026-11-27-session23)."""
    from . import native  # no torch import: this runs before torch loads

    if not (cmd in HEADLESS and load1 < 0.5):
        return False
    if torch_only:
        return True
    # the CPU's flags, not the kernels: loading them here would start OpenMP (libgomp, shared with
    # torch) before the policy is set, and it reads the policy once, at load
    return not native.enabled(environ) or (dtype == "bf16" and not native.bf16_records_likely(environ))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["chat"] + argv
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as e:
        print(e, file=sys.stderr)
        return 2
    from . import USER_OMP_WAIT_POLICY
    from .errors import SpecchatError

    # `distill data --batch N` (N > 1): its batched passes are torch ops over the whole batch
    # (forward_batch), which the bf16 C pass's fp32 activations and passive waits slow: 96 replies in
    # 71 s against 48 s with torch's bf16 pass and active waits (2-core Zen 4, 2026-11-27). Only where
    # torch's bf16 products are native: on an AVX2 CPU its bf16 pass converts in software, and 48
    # self-prompts and replies took 204 s there against 69 s in the C pass (2-core Zen 3, session 35).
    # For this command only (main() also runs in-process, in tests): restored on return.
    torch_bf16 = (args.cmd == "distill" and getattr(args, "distill_cmd", None) == "data" and (getattr(args, "batch", 1) or 1) > 1
                  and "SPECCHAT_NATIVE_BF16" not in os.environ and torch_bf16_native())
    if sys.stdout is None and args.cmd != "chat":  # `specchat generate ... >&-`: the reply had nowhere to go
        print("specchat: error: standard output is closed: nothing could be shown (redirect it, e.g. > FILE)", file=sys.stderr)
        return EXIT_ERROR
    if torch_bf16:
        os.environ["SPECCHAT_NATIVE_BF16"] = "0"
    guard = None
    if args.cmd != "chat":  # the TUI drives the terminal itself
        guard = sys.stdout = _GuardedStdout(sys.stdout)
    try:
        code = _run(args, USER_OMP_WAIT_POLICY)
        if guard is not None and not guard.failed:
            try:  # the output's last block: written here, where a failure is one line, not at exit
                guard.flush()
            except SpecchatError as e:
                print(f"specchat: error: {e}", file=sys.stderr)
                return EXIT_ERROR
        return code
    except BrokenPipeError:  # `specchat generate ... | head`: the reader is gone, nothing to say to it
        if guard is not None:
            sys.stdout = guard.stream
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        if guard is not None:
            sys.stdout = guard.stream
            if guard.failed:  # its buffer would fail again at exit ("Exception ignored ... OSError")
                _drop_stdout()
        if torch_bf16:
            os.environ.pop("SPECCHAT_NATIVE_BF16", None)


class _GuardedStdout:
    """stdout for the headless commands: a failed write (a full disk, an I/O error) is one line,
    ``specchat: error: cannot write to standard output (No space left on device)`` and exit 2, not a
    traceback; what was written before stays. A broken pipe passes as it is (exit 141, quietly)."""

    def __init__(self, stream):
        self.stream = stream
        self.failed = False

    def _guard(self, call, *a):
        from .errors import SpecchatError

        try:
            return call(*a)
        except BrokenPipeError:
            raise
        except OSError as e:
            self.failed = True
            raise SpecchatError(f"cannot write to standard output ({e.strerror or e})") from None

    def write(self, text: str) -> int:
        return self._guard(self.stream.write, text)

    def flush(self) -> None:
        return self._guard(self.stream.flush)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def _drop_stdout() -> None:
    """After a broken pipe: what is left in stdout's buffer goes nowhere, so the interpreter's flush at
    exit does not fail again ("Exception ignored ... BrokenPipeError"). Only the process's own stdout
    (main() also runs in-process, under test capture)."""
    if sys.stdout is not sys.__stdout__ or sys.stdout is None:
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _run(args: argparse.Namespace, user_omp_wait_policy: str | None) -> int:
    from .errors import SpecchatError

    if (user_omp_wait_policy is None and "torch" not in sys.modules and args.cmd in HEADLESS
            and spin_headless(args.cmd, getattr(args, "dtype", None), os.environ, cpu_busy(),
                              torch_only=args.cmd == "distill" and getattr(args, "distill_cmd", None) == "train")):
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"

    try:
        _check_not_empty(args)
        for opt in ("max_new_tokens", "max_context", "warmup"):  # argparse checks the type, not the sign
            if (getattr(args, opt, None) or 0) < 0:
                raise SpecchatError(f"--{opt.replace('_', '-')} must be >= 0, got {getattr(args, opt)}")
        if args.cmd in ("generate", "bench"):
            _check_sampling_args(args)
        if args.cmd == "chat":
            return cmd_chat(args)
        if args.cmd == "generate":
            return cmd_generate(args)
        if args.cmd == "bench":
            _check_bench_mode(args)
        if args.cmd == "bench" and args.draft_cost:
            from .bench import cmd_draft_cost

            return cmd_draft_cost(args)
        if args.cmd == "bench" and args.verify_cost:
            return cmd_verify_cost(args)
        if args.cmd == "bench" and args.tree_scaling:
            from .bench_ssm import cmd_tree_scaling

            return cmd_tree_scaling(args)
        if args.cmd == "bench":
            from .bench import cmd_bench

            return cmd_bench(args)
        if args.cmd == "models":
            return cmd_models(args)
        if args.cmd == "download":
            return cmd_download(args)
        if args.cmd == "distill":
            from .distill import cmd_distill

            return cmd_distill(args)
        build_parser().print_help()
        return EXIT_ERROR
    except (SpecchatError, ValueError, OverflowError) as e:
        print(f"specchat: error: {one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nspecchat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes

# Options whose empty value (`--target "$T"` with T unset) was read as "not given" and ran the default
# silently (--target, --drafter, --strategy, --prompts, --strategies, --compare, --revision) or as the
# current directory (--models, --datastore: ".: cannot read models file (Is a directory)").
NON_EMPTY_OPTS = ("target", "drafter", "models", "datastore", "strategy", "strategies", "prompts", "compare",
                  "prompt_ids", "keymap", "revision")


def _check_not_empty(args: argparse.Namespace) -> None:
    from .errors import SpecchatError

    for opt in NON_EMPTY_OPTS:
        v = getattr(args, opt, None)
        if isinstance(v, str) and not v.strip():
            raise SpecchatError(f"--{opt.replace('_', '-')} is empty: give a value, or leave the option out for the default")
    if any(x == "" for x in getattr(args, "stop", None) or ()):  # ("\n" is a stop string: only "" matches nothing)
        raise SpecchatError("--stop is empty: give the text that ends the reply (a newline: --stop $'\\n')")


BENCH_MODES = ("verify_cost", "draft_cost", "tree_scaling")  # bench's measuring modes, each a run of its own
BENCH_RUN_OPTS = ("strategies", "strategy", "prompts", "prompt_ids", "compare")  # what only a strategies run reads


def _check_bench_mode(args: argparse.Namespace) -> None:
    """One measuring mode at a time, and none with what only a strategies run reads: `--verify-cost
    --draft-cost` ran the drafter's measure alone, and `--verify-cost --strategies sd:4` (or
    --prompts, --compare) measured without them, silently."""
    from .errors import SpecchatError

    modes = [m for m in BENCH_MODES if getattr(args, m, False)]
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    if len(modes) > 1:
        raise SpecchatError(f"{' and '.join(map(flag, modes))}: give one of {', '.join(map(flag, BENCH_MODES))} per run")
    if modes:
        extra = [flag(o) for o in BENCH_RUN_OPTS if getattr(args, o, None) is not None]
        if extra:
            raise SpecchatError(f"{flag(modes[0])} measures on its own: {', '.join(extra)} would be ignored "
                                "(they are for a strategies run)")


def _check_sampling_args(args: argparse.Namespace) -> None:
    """--seed and --temperature, before the seconds of loading."""
    from .errors import SpecchatError
    from .strategy import check_temperature

    last = args.seed + max(1, getattr(args, "samples", None) or 1) - 1  # --samples N uses seeds S..S+N-1
    if not SEED_RANGE[0] <= args.seed <= last <= SEED_RANGE[1]:
        raise SpecchatError(f"--seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]} (64 bits)"
                            + (" for every sample's seed S..S+N-1" if last != args.seed else "") + f", got {args.seed}")
    check_temperature(args.temperature, "--temperature")
    _check_cuts(args)
    from .strategy import from_spec
    from .tree import parse_shape

    # the strategy's shape options too: a typo fails before the seconds of loading
    if args.strategy:
        from_spec(args.strategy)
    if args.tree is not None:
        parse_shape(args.tree)
    if args.arms is not None:
        _parse_arms(args.arms)


def _check_cuts(args: argparse.Namespace) -> None:
    """--top-p, --top-k, --min-p and the repeat penalty in range before the seconds of loading:
    without --strategy the strategy (the session's default) was validated only once the model had
    loaded (or a missing target's error came first), and a measuring mode (bench --verify-cost)
    never validated them."""
    from .strategy import check_cuts

    check_cuts(getattr(args, "top_p", 1.0), getattr(args, "top_k", 0), getattr(args, "min_p", 0.0),
               getattr(args, "repeat_penalty", 1.0), getattr(args, "repeat_last_n", 64), flags=True)


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


# ---- strategy from options ------------------------------------------------------------------------------
def strategy_from_args(args: argparse.Namespace, has_drafter_model: bool, default=None):
    """The strategy the options ask for; without --strategy, ``default`` (the session's: the
    models.toml pairing's best measured strategy when its drafter was loaded), else the preset
    default for whether a drafter model is loaded."""
    from .session import default_strategy
    from .strategy import from_spec
    from .tree import parse_shape

    import math

    from .errors import SpecchatError

    for opt in ("temperature", "top_p", "min_p", "repeat_penalty", "lambda_ucb"):
        v = getattr(args, opt, None)
        if v is not None and not math.isfinite(v):  # nan read as "T > 0 needed", inf as uniform noise
            raise SpecchatError(f"--{opt.replace('_', '-')} must be a finite number, got {v}")
    s = from_spec(args.strategy) if args.strategy else (default or default_strategy(has_drafter_model))
    changes: dict[str, Any] = {"temperature": args.temperature, "top_p": args.top_p, "top_k": getattr(args, "top_k", 0),
                               "min_p": getattr(args, "min_p", 0.0), "repeat_penalty": getattr(args, "repeat_penalty", 1.0),
                               "repeat_last_n": getattr(args, "repeat_last_n", 64), "seed": args.seed}
    for opt, field in (("draft_len", "draft_len"), ("verify", "verify"), ("vocab", "vocab"), ("ssm_tree", "ssm_tree"), ("backtrack", "backtrack")):
        if getattr(args, opt) is not None:
            changes[field] = getattr(args, opt)
    if args.tree is not None:
        changes["tree"] = parse_shape(args.tree)
    if args.arms is not None:
        changes["arms"] = _parse_arms(args.arms)
    if args.lambda_ucb is not None:
        changes["lambda_ucb"] = args.lambda_ucb
    if args.node_budget is not None:
        changes["node_budget"] = args.node_budget
    if args.drafter == "ngram" and s.name != "ar":
        changes["drafter"] = "ngram"
    s = s.replace(**changes)
    return s.validate(has_drafter_model=has_drafter_model)


def check_bridge(s, session) -> None:
    """A vocabulary bridge picked (``--vocab tli``, ``sd:4@slrs``) for a drafter model that shares the
    target's vocabulary: nothing is bridged, so the pick was silently not used (the decoder bridges
    only a drafter of another vocabulary). Refused, as --vocab with pld or ar is."""
    from .errors import SpecchatError

    if (s.vocab == "auto" or s.name == "ar" or s.drafter != "model" or not session.has_drafter
            or session.decoder.bridged):
        return
    raise SpecchatError(f"vocab bridge {s.vocab!r} (--vocab, or @{s.vocab} in a spec): the drafter {session.drafter.name} shares "
                        f"{session.target.name}'s vocabulary, so there is nothing to bridge (a bridge is for a drafter of "
                        "another vocabulary)")


def _parse_arms(text: str) -> tuple[tuple[int, ...], ...]:
    """--arms: tree shapes separated by ';' (a trailing ';' is allowed), at least one."""
    from .errors import SpecchatError
    from .tree import parse_shape

    arms = tuple(parse_shape(a) for a in text.split(";") if a.strip())
    if not arms:
        raise SpecchatError(f"--arms {text!r}: no tree shape (e.g. '3,2,2,1,1;3,3,2,1')")
    return arms


def pool_starved_warning(model, environ) -> str | None:
    """The one-line warning for OMP_WAIT_POLICY=ACTIVE over a model whose passes run in the C
    kernels' own thread pool: torch's actively spinning threads then take the pool's cores
    (SmolLM2 ar 32.9 tok/s vs 126.8 passive, bench/results/2026-11-25-pool.md)."""
    if environ.get("OMP_WAIT_POLICY", "").strip().upper() != "ACTIVE":
        return None
    table = getattr(model, "_native_table", None)
    if table is None or table() is None:
        return None
    return ("specchat: warning: OMP_WAIT_POLICY=ACTIVE slows this model's C pass several times over "
            "(torch's spinning threads take its thread pool's cores); unset it")


def load_session(args: argparse.Namespace):
    from .session import ChatSession

    if not args.target:  # a models file without a default target: one line before any loading
        from .registry import load_registry
        from .session import default_target_name

        default_target_name(load_registry(args.models))
    session = ChatSession.load(target=args.target, drafter=args.drafter, models_file=args.models, dtype=args.dtype,
                               max_context=args.max_context, datastore=getattr(args, "datastore", None))
    warning = pool_starved_warning(session.target.model, os.environ)
    if warning:
        print(warning, file=sys.stderr)
    from .session import load_warnings

    for line in load_warnings(session):
        print(f"specchat: warning: {line}", file=sys.stderr)
    return session


def parse_prompt_ids(text: str) -> list[int]:
    """--prompt-ids: comma-separated token ids (checked against the vocabulary by Decoder.start)."""
    from .errors import SpecchatError

    try:
        if not text.isascii():  # int() reads "٣" as 3: ASCII digits only, as the other number options
            raise ValueError
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SpecchatError(f"--prompt-ids expects comma-separated integers, got {text!r}") from None


_NOT_UTF8 = re.compile("[\ud800-\udfff]")  # how Python keeps bytes that are not UTF-8 (argv, stdin)


def valid_text(text: str | None, what: str) -> str | None:
    """``text`` with each byte that was not valid UTF-8 replaced by U+FFFD, and then a one-line warning
    naming ``what``: the tokenizer takes valid text only, and the rest of the prompt is kept."""
    if text is None:
        return None
    fixed, n = _NOT_UTF8.subn("\ufffd", text)
    if n:
        print(f"specchat: warning: {what} is not valid UTF-8: {n} byte(s) replaced by U+FFFD", file=sys.stderr)
    return fixed


def _stops(args: argparse.Namespace) -> list[str]:
    """``--stop`` texts as the reply's text can hold them (invalid UTF-8 bytes as U+FFFD, with the
    warning, as the prompt's: a stop of undecodable bytes never matched, silently)."""
    if getattr(args, "_stops", None) is None:
        args._stops = [valid_text(x, "--stop") or "" for x in (args.stop or ())]
    return args._stops


def _read_stdin() -> str:
    """The prompt piped on stdin, read with a bound: ``generate < /dev/zero`` (or a stray ``cat`` of a
    disk image) is one clear error, not all of memory."""
    from .bench import MAX_PROMPTS_BYTES
    from .errors import SpecchatError

    buf = getattr(sys.stdin, "buffer", None)
    try:
        if buf is None:  # a text stream (tests)
            text = sys.stdin.read(MAX_PROMPTS_BYTES + 1)
            data_len = len(text.encode("utf-8", "surrogateescape"))
        else:
            data = buf.read(MAX_PROMPTS_BYTES + 1)
            data_len = len(data)
    except OSError as e:  # an I/O error, a socket reset: one line, not a traceback
        raise SpecchatError(f"cannot read the prompt on stdin ({e.strerror or e})") from None
    if data_len > MAX_PROMPTS_BYTES:
        raise SpecchatError(f"the prompt on stdin is larger than {MAX_PROMPTS_BYTES >> 20} MB (not a prompt?)")
    if buf is None:
        return text.removeprefix("\ufeff")
    # bytes that are not in the locale's encoding become surrogates (valid_text), not a UnicodeDecodeError;
    # a UTF-8 byte-order mark (a file saved by Notepad) is not part of the prompt
    return data.decode(sys.stdin.encoding or "utf-8", "surrogateescape").removeprefix("\ufeff")


def check_prompt_args(args: argparse.Namespace) -> None:
    """generate's prompt options that cannot go together (before the seconds of loading): with
    --prompt-ids, PROMPT and --system were dropped silently (the ids are fed as they are, no template)."""
    from .errors import SpecchatError

    if not args.prompt_ids:
        return
    if args.prompt is not None:  # one of them would be ignored
        raise SpecchatError("give PROMPT or --prompt-ids, not both")
    if getattr(args, "system", None):
        raise SpecchatError("--system needs a text prompt (the chat template): --prompt-ids are fed as they are")
    parse_prompt_ids(args.prompt_ids)


def prompt_ids_from_args(args: argparse.Namespace, session) -> list[int]:
    from .errors import SpecchatError

    if args.prompt_ids:
        check_prompt_args(args)
        return parse_prompt_ids(args.prompt_ids)
    text = args.prompt
    what = "PROMPT"
    if text is None:
        # `<&-` leaves sys.stdin None: no prompt there, as at a terminal
        text, what = (_read_stdin() if sys.stdin is not None and not sys.stdin.isatty() else ""), "the prompt on stdin"
    if not text.strip():
        raise SpecchatError("empty prompt: pass PROMPT, pipe text on stdin, or use --prompt-ids")
    tok = session.tokenizer
    if tok is None:
        raise SpecchatError(f"{session.target.name} has no tokenizer: pass --prompt-ids")
    text = valid_text(text, what)
    system = valid_text(getattr(args, "system", None), "--system")
    if args.raw:
        if system:
            raise SpecchatError("--system needs the chat template: leave out --raw")
        ids = tok.encode(text, add_special_tokens=True)
    else:
        head = [{"role": "system", "content": system}] if system else []
        ids = session.encode_chat(head + [{"role": "user", "content": text}])
    return ids


# ---- commands --------------------------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from .events import GenerationSummary
    from .generate import peak_rss_mb

    if args.samples is not None and args.samples < 1:
        raise ValueError("--samples must be >= 1")
    check_prompt_args(args)
    if args.strategy:  # a malformed spec, or a knob out of range for it (--draft-len 0, --top-p 0),
        strategy_from_args(args, has_drafter_model=True)  # fails before the seconds (minutes) of loading
    session = load_session(args)
    if args.ignore_eos:
        session.decoder.eos_ids = set()
    strategy = strategy_from_args(args, session.has_drafter, default=session.strategy)
    check_bridge(strategy, session)
    session.strategy = strategy
    ids = prompt_ids_from_args(args, session)
    dec = session.decoder

    if args.samples:
        return _generate_samples(args, session, strategy, ids)

    summary = GenerationSummary()
    steps: list[dict[str, Any]] = []
    token_ids: list[int] = []
    text_parts: list[str] = []
    stop = threading.Event()
    summary.prefill_s = dec.start(ids)
    stream = not args.json
    ids_only = session.tokenizer is None  # no text to show: the ids, as --samples prints them
    interrupted = False
    t0 = time.perf_counter()
    try:
        for ev in dec.steps(strategy, args.max_new_tokens, stop, stop_strings=_stops(args)):
            summary.add(ev)
            shown = ",".join(map(str, ev.emitted)) if ids_only else ev.text
            if ids_only and shown and token_ids:
                shown = "," + shown
            token_ids.extend(ev.emitted)
            if ev.emitted:
                steps.append(ev.to_json())
            text_parts.append(ev.text)
            if stream and shown:
                sys.stdout.write(shown)
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    # tokens/s on bench's clock: the decode loop's wall time, prefill left out (the steps' own ms
    # summed leave out the work between them: the two commands' figures differed for one run)
    summary.decode_s = time.perf_counter() - t0 if summary.new_tokens else 0.0
    if stream:
        sys.stdout.write("\n")
        sys.stdout.flush()
        s = summary
        print(f"[{session.strategy_label(strategy)}] {s.new_tokens} tokens in {s.steps} steps, {s.tokens_per_s:.1f} tok/s, "
              f"mean accepted {s.mean_accepted:.2f}, finish {s.finish_reason or ('interrupted' if interrupted else '?')}",
              file=sys.stderr)
    else:
        print(json.dumps({
            "text": "".join(text_parts),
            "token_ids": token_ids,
            "steps": steps,
            "tokens_per_s": summary.tokens_per_s,
            "mean_accepted": summary.mean_accepted,
            "peak_mem_mb": peak_rss_mb(),
            "prefill_s": summary.prefill_s,
            "finish_reason": "interrupted" if interrupted else summary.finish_reason,
            "strategy": strategy.to_dict(),
        }))
    if interrupted:
        print("specchat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _generate_samples(args: argparse.Namespace, session, strategy, ids: list[int]) -> int:
    """``generate --samples N``: N generations with seeds S..S+N-1, each printed as it finishes (its
    text, or its ids without a tokenizer; ``--json``: one object at the end with each sample's ids,
    text and finish reason). Ctrl-C keeps the finished samples and the one in progress (finish
    "interrupted") and exits 130."""
    dec = session.decoder
    samples: list[dict[str, Any]] = []
    interrupted = False
    try:
        for i in range(args.samples):
            seed = args.seed + i
            dec.start(ids)
            cur: dict[str, Any] = {"seed": seed, "token_ids": [], "text": "", "finish_reason": None}
            samples.append(cur)
            for ev in dec.steps(strategy.replace(seed=seed), args.max_new_tokens, stop_strings=_stops(args)):
                cur["token_ids"].extend(ev.emitted)
                cur["text"] += ev.text
                cur["finish_reason"] = ev.finish_reason or cur["finish_reason"]
            if not args.json:
                _print_sample(cur, session)
    except KeyboardInterrupt:
        interrupted = True
        if samples and samples[-1]["finish_reason"] is None:
            samples[-1]["finish_reason"] = "interrupted"
            if not args.json:
                _print_sample(samples[-1], session)
    if args.json:
        print(json.dumps({"samples": samples, "interrupted": interrupted}))
    if interrupted:
        print(f"specchat: interrupted ({sum(s['finish_reason'] != 'interrupted' for s in samples)} of {args.samples} samples finished)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _print_sample(smp: dict[str, Any], session) -> None:
    body = smp["text"] if session.tokenizer is not None else ",".join(map(str, smp["token_ids"]))
    print(f"--- sample seed {smp['seed']} ({len(smp['token_ids'])} tokens, finish {smp['finish_reason']})\n{body}", flush=True)


def cmd_chat(args: argparse.Namespace) -> int:
    from .registry import load_registry

    # a broken models.toml is reported before the UI starts (one without a default target is not: the
    # app shows the load failure and Ctrl+O picks one of its models)
    load_registry(args.models)
    if args.max_new_tokens < 1:  # (every reply would end before its first token)
        from .errors import SpecchatError

        raise SpecchatError(f"--max-new-tokens must be at least 1 for chat, got {args.max_new_tokens}")
    if args.keymap and not Path(args.keymap).expanduser().is_file():
        from .errors import SpecchatError

        raise SpecchatError(f"--keymap {args.keymap}: no such file")
    from app.main import run_app  # lazy: only the chat command needs the UI

    from .strategy import from_spec

    initial = from_spec(args.strategy) if args.strategy else None  # a bad spec: one line, before the app starts
    sampling = chat_sampling(args)

    def factory():
        from .session import ChatSession

        return ChatSession.load(target=args.target, drafter=args.drafter, strategy=initial, models_file=args.models,
                                dtype=args.dtype, max_context=args.max_context, datastore=args.datastore)

    def loader(target: str, drafter: str):  # Ctrl+O picks: same models file, dtype and context
        from .session import ChatSession

        return ChatSession.load(target=target, drafter=drafter, models_file=args.models, dtype=args.dtype,
                                max_context=args.max_context)

    by = run_app(factory, initial_strategy=initial, initial_sampling=sampling, max_new_tokens=args.max_new_tokens, model_loader=loader,
                 models_file=args.models, system_prompt=valid_text(args.system, "--system"), keymap_file=args.keymap)
    if by is not None:  # quit by a signal: said, with the shell's status for it (the chat is saved as at Ctrl+Q)
        import signal

        print(f"specchat: interrupted by {by} (quit as Ctrl+Q quits: a reply in flight stopped and kept)", file=sys.stderr)
        return 128 + int(getattr(signal, by))
    return 0


def chat_sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags `chat` was given, as Strategy fields, each checked before the app starts
    (one line, exit 2): the app sets them over the first model's strategy (app.screens.chat)."""
    import math

    from .errors import SpecchatError
    from .strategy import SAMPLING_FIELDS, check_temperature, preset

    given = {k: getattr(args, k) for k in SAMPLING_FIELDS if getattr(args, k, None) is not None}
    for k, v in given.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecchatError(f"--{k.replace('_', '-')} must be a finite number, got {v}")
    if "seed" in given and not SEED_RANGE[0] <= given["seed"] <= SEED_RANGE[1]:
        raise SpecchatError(f"--seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]} (64 bits), got {given['seed']}")
    if "temperature" in given:
        check_temperature(given["temperature"], "--temperature")
    preset("ar").replace(**given).validate(has_drafter_model=False)  # the ranges: a StrategyError, one line
    return given


def cmd_download(args: argparse.Namespace) -> int:
    """Download REF with a progress line per file on stderr. Ctrl-C cancels between chunks (exit 130,
    the partial file is kept and a re-run resumes it); a second Ctrl-C leaves at once."""
    from .errors import SpecchatError
    from .hub import REPO_ID, DownloadCancelled, TerminalProgress, download
    from .registry import load_registry

    if args.include is not None and any(not g.strip() for g in args.include):  # matched nothing, silently
        raise SpecchatError("--include is empty: give a file pattern (e.g. '*.gguf'), or leave it out for the model's files")
    entry = load_registry(args.models).get(args.ref)
    repo = entry.hub_id if entry is not None else args.ref
    if not repo or not REPO_ID.match(repo):
        raise SpecchatError(f"{args.ref!r} is neither a models.toml name with a hub_id nor a Hub id (owner/name)")
    revision = args.revision or (entry.revision if entry else None)
    printer = TerminalProgress(sys.stderr)
    cancel = threading.Event()
    result: dict[str, Any] = {}
    finished = threading.Event()  # not Thread.join: an interrupted join marks the thread stopped (3.11)

    def run() -> None:
        try:
            result["path"] = download(repo, revision, progress=printer, cancel=cancel, include=args.include)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            result["error"] = e
        finally:
            finished.set()

    threading.Thread(target=run, name="download", daemon=True).start()
    try:
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt:
        cancel.set()
        try:
            while not finished.wait(0.1):
                pass
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: leave now; the partial file stays for the next run
    printer.close()
    if "path" not in result:
        err = result.get("error")
        if err is None or isinstance(err, DownloadCancelled) or cancel.is_set():
            # cancelled, also where the worker was waiting on the network then and failed with that
            msg = str(err) if isinstance(err, DownloadCancelled) else f"download of {repo} cancelled; run it again to resume"
            print(f"specchat: {msg}", file=sys.stderr)
            return EXIT_INTERRUPTED
        raise err
    print(f"{repo} -> {result['path']}")
    return 0


def cmd_verify_cost(args: argparse.Namespace) -> int:
    from .costmodel import DEFAULT_SIZES, MEASURE_PREFIX, calibrate
    from .errors import SpecchatError

    rows = MEASURE_PREFIX + max(DEFAULT_SIZES) + 1
    if args.max_context and args.max_context < rows:  # else the measure fails with "context full"
        raise SpecchatError(f"--verify-cost measures passes of up to {max(DEFAULT_SIZES)} rows after {MEASURE_PREFIX} tokens: "
                            f"--max-context must be at least {rows} (or 0: the model's own)")
    loaded = load_target(args, dtype=args.dtype, max_context=args.max_context)
    cost = calibrate(loaded.model)
    if args.json:
        print(json.dumps({"target": loaded.description, **cost.to_json()}))
        return 0
    print(f"target: {loaded.description}")
    print(f"fit: t(n) = {cost.a:.2f} + {cost.b:.3f}*n + {cost.c:.5f}*n^2 ms")
    print(f"{'n':>4} {'measured ms':>12} {'fit ms':>8} {'t(n)/t(1)':>10}")
    for n, ms in sorted(cost.points.items()):
        print(f"{n:>4} {ms:>12.2f} {cost(n):>8.2f} {ms / cost.points[min(cost.points)]:>10.2f}")
    return 0


def load_target(args: argparse.Namespace, **kw):
    """--target (a models.toml name of --models' file, a path, a Hub id), else that file's default
    target, loaded alone: the measuring modes of bench (--verify-cost, --tree-scaling)."""
    from .loading import load
    from .registry import load_registry
    from .session import default_target_name

    reg = load_registry(args.models)
    return load(args.target or default_target_name(reg), registry=reg, **kw)


def cmd_models(args: argparse.Namespace) -> int:
    from .registry import load_registry

    reg = load_registry(args.models)
    rows = []
    for e in reg.models.values():
        base = reg.path.parent if reg.path else None
        local = e.local_path(base)
        where = str(local) if local else None
        if where is None and e.hub_id:
            from .loading import _hub_cached

            cached = _hub_cached(e.hub_id, e.revision)
            where = str(cached) if cached else None
        rows.append({"name": e.name, "hub_id": e.hub_id, "role": e.role, "family": e.family, "params": e.params,
                     "available": where is not None, "path": where, "default": e.default})
    if args.json:
        print(json.dumps({"models": rows, "pairings": [vars(p) for p in reg.pairings]}))
        return 0
    w = max((len(r["name"]) for r in rows), default=4)
    print(f"{'name':<{w}}  {'available':<9}  {'role':<22}  {'params':<6}  hub id")
    for r in rows:
        mark = "yes" if r["available"] else "no"
        if r["default"]:
            mark += " *"
        print(f"{r['name']:<{w}}  {mark:<9}  {','.join(r['role'] or []):<22}  {r['params'] or '':<6}  {r['hub_id'] or ''}")
    if reg.pairings:
        print("\npairings (target <- drafter):")
        for p in reg.pairings:
            print(f"  {p.target} <- {p.drafter}" + (f"  [{p.vocab}]" if p.vocab else "") + ("  (default)" if p.default else ""))
    print(f"\n* default target; registry: {reg.path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
