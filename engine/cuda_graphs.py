"""CUDA graphs for the decode loop's fixed-shape passes (Snakes and Ladders §3.3; mamba-drafters
§4.1 keeps one state cache per draft batch size B_i for the same reason): a Mamba-2 drafter's
batched step, one graph per batch size and depth of the chosen tree shape, and a fresh tree's
verify pass, one per tree size (a whole Mamba-2; each run of Mamba layers of a Granite-4.0-H
hybrid, whose attention layers run eagerly between them). At these sizes a step is a few
hundred small kernels whose launches, not their work, set the time; a graph replays them all in
one launch.

A graph replays the kernels it recorded on the memory it recorded, so:

  * every input is copied into a static buffer of the graph (``inputs``) before a replay;
  * outputs come back in the graph's static buffers, valid until its next replay: a caller copies
    what it keeps;
  * a graph's key names everything the recording depends on: shapes, Python-side control flow,
    and the addresses of the state buffers it reads and writes in place (a draft batch's pool
    buffers; the committed state, which alternates between two buffers on commit).

Recording: warm-up runs on a side stream (Triton compiles, cuBLAS sets up), the buffers in
``mutated`` restored after each, then ``torch.cuda.graph`` records one more run without running
it; the caller's call is then the first replay. A recording that fails leaves that key eager.

``SPECCHAT_CUDA_GRAPHS=1`` (resolved once) turns graphs on for models built on CUDA; a model's
``use_cuda_graphs(on)`` switches them at run time. Elsewhere everything runs eagerly.
``GraphSet(device, emulate=True)`` runs the same bookkeeping on any device — recording runs the
function, a replay runs it again into the recorded output buffers — so tests check it on a CPU.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Hashable, Sequence

import torch

ENABLED = os.environ.get("SPECCHAT_CUDA_GRAPHS", "0").strip().lower() in ("1", "on", "true", "yes")


def leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors of a nest of tuples, lists and dicts, in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for x in tree for t in leaves(x)]
    if isinstance(tree, dict):
        return [t for x in tree.values() for t in leaves(x)]
    return []


class Graph:
    """One recording: static input buffers, the outputs it writes, and ``replay``."""

    __slots__ = ("inputs", "outputs", "replay")

    def __init__(self, inputs: dict[str, torch.Tensor], outputs: Any, replay: Callable[[], None]):
        self.inputs, self.outputs, self.replay = inputs, outputs, replay


class GraphSet:
    """Graphs of one model, by key. ``run(key, fn, inputs, mutated)`` returns ``fn(**inputs)``'s
    outputs, from the graph of ``key`` (recorded on first use)."""

    def __init__(self, device: torch.device | str, emulate: bool = False, warmup: int = 2):
        self.device = torch.device(device)
        if not emulate and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {self.device} (emulate=True runs the bookkeeping anywhere)")
        self.emulate, self.warmup = emulate, warmup
        self.graphs: dict[Hashable, Graph | None] = {}  # None: recording failed, that key runs eagerly
        self.replays = 0

    @classmethod
    def for_device(cls, device: torch.device | str) -> "GraphSet | None":
        """A GraphSet on a CUDA device, else None (eager)."""
        dev = torch.device(device)
        return cls(dev) if dev.type == "cuda" and torch.cuda.is_available() else None

    def __len__(self) -> int:
        return sum(g is not None for g in self.graphs.values())

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: dict[str, torch.Tensor],
            mutated: Sequence[torch.Tensor] = ()) -> Any:
        """``fn(**inputs)`` through the graph of ``key``. ``mutated``: tensors ``fn`` updates in
        place (restored after each warm-up run, so the caller's call advances them once)."""
        if key not in self.graphs:
            self.graphs[key] = self._record(fn, inputs, mutated)
        g = self.graphs[key]
        if g is None:
            return fn(**inputs)
        for name, t in inputs.items():
            g.inputs[name].copy_(t, non_blocking=True)
        g.replay()
        self.replays += 1
        return g.outputs

    def _record(self, fn: Callable[..., Any], inputs: dict[str, torch.Tensor], mutated: Sequence[torch.Tensor]) -> Graph | None:
        static = {name: t.to(self.device, copy=True) for name, t in inputs.items()}
        saved = [m.clone() for m in mutated]

        def restore() -> None:
            for m, s in zip(mutated, saved):
                m.copy_(s)

        if self.emulate:
            for _ in range(self.warmup):
                fn(**static)
                restore()
            outputs = fn(**static)  # the "recording": a real one runs nothing, so undo its effects
            restore()

            def replay() -> None:
                for dst, src in zip(leaves(outputs), leaves(fn(**static))):
                    dst.copy_(src)
            return Graph(static, outputs, replay)

        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn(**static)
                restore()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs = fn(**static)
        except Exception as e:  # an op that cannot be recorded (a host sync, say): this key stays eager
            warnings.warn(f"CUDA graph recording failed, running eagerly: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
            restore()
            return None
        return Graph(static, outputs, graph.replay)
