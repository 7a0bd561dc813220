"""Mamba-1 (`state-spaces/mamba-*-hf`, transformers' MambaForCausalLM names) as a speculative target.

One page: the config, the recurrent state (the "cache"), and the model. The math is transformers'
MambaMixer (reference/models.md §2.1) with one deliberate difference: every multi-token pass
starts from the committed state (transformers' multi-token scan starts from zeros, §0 finding 4).

    verify(tokens, parents)  one pass over a packed tree from the committed state, scanned depth
                             by depth: all nodes of one depth at once, each from its parent's
                             state (STree §3, ALGORITHMS.md §5 "Mamba-1"); conv windows are
                             gathered along the ancestors, past the root from the committed conv
                             state. No repeated tokens, no state per leaf.
    commit(rows)             activation replay (Snakes and Ladders §3.1 "Activation Replay"): the
                             state recursion alone, over the cached x/dt/B of the accepted rows;
                             the conv state rolls along them. No projection is recomputed.

Shape letters: T rows this call (tokens / tree nodes), M rows committed by one commit, D model
width, I inner channels (d_inner = expand * D), N state size, R dt rank, K conv kernel, V vocab.
Batch is 1: trees are packed along T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .base import CausalLM
from .common import as_t, require, rms_norm
from .llama import _check_shape, _getter

MODEL_TYPES = ("mamba",)
NO_CONTEXT_LIMIT = 1 << 20  # a recurrent state has no positional limit; this only bounds the decode loop


@dataclass
class MambaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    state_size: int = 16
    conv_kernel: int = 4
    time_step_rank: int = 48
    layer_norm_epsilon: float = 1e-5
    use_bias: bool = False
    use_conv_bias: bool = True
    residual_in_fp32: bool = True
    tie_word_embeddings: bool = True

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> "MambaConfig":
        hidden = int(require(cfg, "hidden_size", where))
        expand = cfg.get("expand", 2)
        if not isinstance(expand, (int, float)) or isinstance(expand, bool) or not 0 < expand <= 64:
            raise ModelLoadError(f"{where}: config field 'expand' has an absurd value {expand!r}")
        inner = int(require(cfg, "intermediate_size", where)) if cfg.get("intermediate_size") is not None else int(expand * hidden)
        rank = cfg.get("time_step_rank", "auto")
        if rank == "auto":
            rank = math.ceil(hidden / 16)  # transformers' MambaConfig and mamba_ssm: ceil(d_model / 16)
        elif isinstance(rank, bool) or not isinstance(rank, int) or not 0 < rank <= inner:
            raise ModelLoadError(f"{where}: config field 'time_step_rank' has an absurd value {rank!r} (\"auto\" or 1..{inner})")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported for mamba (silu)")
        kernel = int(require(cfg, "conv_kernel", where)) if "conv_kernel" in cfg else 4
        if kernel > 64:
            raise ModelLoadError(f"{where}: config field 'conv_kernel' has an absurd value {kernel!r}")
        return cls(
            vocab_size=int(require(cfg, "vocab_size", where)),
            hidden_size=hidden,
            num_layers=int(require(cfg, "num_hidden_layers", where)),
            intermediate_size=inner,
            state_size=int(require(cfg, "state_size", where)) if "state_size" in cfg else 16,
            conv_kernel=kernel,
            time_step_rank=int(rank),
            layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
            use_bias=bool(cfg.get("use_bias", False)),
            use_conv_bias=bool(cfg.get("use_conv_bias", True)),
            residual_in_fp32=bool(cfg.get("residual_in_fp32", True)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        )


# ---------------------------------------------------------------------------------------------
# The recurrent state: what a KV cache is to attention
# ---------------------------------------------------------------------------------------------
class MambaState:
    """Committed state of every layer plus the activations of the last verified tree.

    conv[l] (K-1, I): the last K-1 committed pre-conv inputs, oldest first (time-major, so tree
    windows are a row gather; transformers keeps (I, K)). ssm[l] (I, N): the SSM state, in the
    scan dtype of A (fp32; fp64 for an fp64 model).
    Scratch: per layer the tree nodes' pre-conv x, post-conv x, dt and B — all replay needs.

    Rewinding a recurrence needs the old state, so rollback(n) reaches only n == 0, n == length,
    or back into the last commit or prefill chunk (its start state and activations are kept: the
    decode loop cuts a step's tokens after an EOS). Anything else raises ValueError.
    """

    prefix_rollback = False  # only the cases above, not any committed prefix (generate.Decoder.start)

    def __init__(self, A: list[torch.Tensor], kernel: int, capacity: int, dtype: torch.dtype):
        self.A = A  # per layer (I, N): replay needs the decay, nothing else of the weights
        self.capacity = capacity
        self.dims = (len(A), A[0].shape[0], A[0].shape[1], kernel)
        self.dtype = dtype
        self.reset()

    @property
    def scratch(self) -> int:
        return len(self.parents)

    def room(self) -> int:
        """Rows still free for scratch nodes or new committed tokens."""
        return self.capacity - self.length - self.scratch

    def reset(self) -> None:
        Ly, I, N, K = self.dims
        self.length = 0
        self.conv = [torch.zeros(K - 1, I, dtype=self.dtype) for _ in range(Ly)]
        self.ssm = [torch.zeros(I, N, dtype=self.A[l].dtype) for l in range(Ly)]
        self._undo: tuple[int, list, list, list] | None = None  # (length, conv, ssm, acts of the rows) before the last commit
        self.clear_scratch()

    def clear_scratch(self) -> None:
        self.parents: list[int] = []
        self.acts: list[dict[str, torch.Tensor]] = []  # per layer: xpre, x (T, I), dt (T, I) scan dtype, B (T, N)

    def commit(self, rows: Sequence[int]) -> None:
        """Activation replay of the scratch chain ``rows`` (root first) from the committed state."""
        rows = list(rows)
        if rows:
            for j, r in enumerate(rows):
                want = rows[j - 1] if j else -1
                if not 0 <= r < self.scratch or self.parents[r] != want:
                    raise ValueError(f"commit rows {rows} are not a root-to-node chain of the {self.scratch} verified nodes")
            idx = torch.tensor(rows, dtype=torch.long)
            kept = [{k: v[idx] for k, v in a.items()} for a in self.acts]
            self.advance(*_replay(self.conv, self.ssm, kept, self.A), kept)
        self.clear_scratch()

    def advance(self, conv: list, ssm: list, acts: list) -> None:
        """Make (conv, ssm) the committed state after the M rows of ``acts``; the state before and
        those activations are kept so that rollback can land inside this commit."""
        self._undo = (self.length, self.conv, self.ssm, acts)
        self.conv, self.ssm = conv, ssm
        self.length += acts[0]["x"].shape[0]

    def rollback(self, n: int) -> None:
        if n == self.length:
            self.clear_scratch()
            return
        if n == 0:
            self.reset()
            return
        u = self._undo
        if u is None or not u[0] <= n < self.length:
            lo = f", or {u[0]}..{self.length} (inside the last commit)" if u is not None else ""
            raise ValueError(f"cannot roll a Mamba state back to {n} tokens: a recurrent state rewinds only to 0, "
                             f"{self.length}{lo}; reset and prefill instead")
        length, conv, ssm, kept = u
        m = n - length
        self.conv, self.ssm = _replay(conv, ssm, [{k: v[:m] for k, v in a.items()} for a in kept], self.A)
        self.length = n  # the undo entry stays: it still describes a commit that contains n
        self.clear_scratch()


@torch.inference_mode()
def _replay(conv: list, ssm: list, acts: list, A: list) -> tuple[list, list]:
    """New (conv, ssm) per layer after the rows of ``acts`` (a chain, M rows): the SSM recursion
    over cached x, dt, B and the conv window rolled along the pre-conv x. Fresh tensors: the old
    ones stay valid as the undo state."""
    new_conv, new_ssm = [], []
    for l, a in enumerate(acts):
        M = a["x"].shape[0]
        if M == 0:
            new_conv.append(conv[l])
            new_ssm.append(ssm[l])
            continue
        S = selective_scan(a["x"], a["dt"], a["B"], A[l], ssm[l], [(slice(j, j + 1), slice(j - 1, j) if j else None) for j in range(M)])
        new_ssm.append(S[-1].clone())  # (I, N)
        window = torch.cat([conv[l], a["xpre"]])  # (K-1+M, I)
        new_conv.append(window[window.shape[0] - conv[l].shape[0]:].clone())
    return new_conv, new_ssm


# ---------------------------------------------------------------------------------------------
# Tree plumbing and the scan
# ---------------------------------------------------------------------------------------------
def _index(ix: list[int]) -> slice | torch.Tensor:
    """A slice when the rows are consecutive (chains, breadth-first trees), else an index tensor."""
    if ix == list(range(ix[0], ix[0] + len(ix))):
        return slice(ix[0], ix[0] + len(ix))
    return torch.tensor(ix, dtype=torch.long)


def tree_plan(parents: Sequence[int], kernel: int) -> tuple[list, torch.Tensor]:
    """Levels and conv windows of a packed tree (parents precede children; -1 = committed prefix).

    levels: per depth, (rows, their parents' rows or None for depth 1), as slices or tensors.
    windows (T, K): row t's conv window as indices into cat(conv state (K-1, I), x (T, I)):
    t, parent(t), ... K-1 steps up the tree, past the root into the committed conv state.
    """
    T = len(parents)
    past = list(range(kernel - 1))  # the committed conv rows, oldest first
    win: list[list[int]] = []
    depth: list[int] = []
    for t, p in enumerate(parents):
        if not -1 <= p < t:
            raise ValueError(f"tree parent {p} of row {t} must be -1 or an earlier row")
        win.append((win[p][1:] if p >= 0 else past) + [kernel - 1 + t])
        depth.append(depth[p] + 1 if p >= 0 else 1)
    by_depth: dict[int, list[int]] = {}
    for t in range(T):
        by_depth.setdefault(depth[t], []).append(t)
    levels = []
    for d in sorted(by_depth):
        rows = by_depth[d]
        levels.append((_index(rows), None if d == 1 else _index([parents[t] for t in rows])))
    return levels, torch.tensor(win, dtype=torch.long).reshape(T, kernel)


def selective_scan(x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, A: torch.Tensor, S0: torch.Tensor, levels: list) -> torch.Tensor:
    """States (T, I, N) of every row: S_t = exp(dt_t ⊗ A) ⊙ S_parent(t) + (dt_t · x_t) ⊗ B_t
    (Mamba §3.2 zero-order hold as in mamba_ssm's selective_scan_ref), S_parent = S0 at depth 1.

    x, dt (T, I); B (T, N); A (I, N) < 0; S0 (I, N), dt, A in the scan dtype (fp32 as in
    transformers, or fp64). The recursion runs level by level, one vectorised update per depth
    (STree §3; a chain is T levels of one row): the same elementwise ops whatever the tree, so
    replaying a path from the same activations reproduces its verified states exactly (tested).
    """
    dA = torch.exp(dt[:, :, None] * A)  # (T, I, N)
    S = (dt * x.to(dt.dtype))[:, :, None] * B.to(dt.dtype)[:, None, :]  # (T, I, N): dt·x ⊗ B, becomes the state
    for rows, par in levels:
        prev = S0 if par is None else S[par]
        S[rows] += dA[rows] * prev
    return S


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class Mamba(CausalLM):
    family = "mamba"

    def __init__(self, cfg: MambaConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, max_context: int | None = None):
        super().__init__()
        self.cfg = cfg
        self._dtype = dtype
        self.max_context = max_context or NO_CONTEXT_LIMIT
        D, I, N, R, K = cfg.hidden_size, cfg.intermediate_size, cfg.state_size, cfg.time_step_rank, cfg.conv_kernel
        # The SSM runs in fp32 as in transformers, whatever the weights (fp64 for fp64 models: exact tests)
        sdt = self.scan_dtype = torch.promote_types(dtype, torch.float32)
        get = _getter(sd, "Mamba")
        emb = get("backbone.embeddings.weight")
        _check_shape(emb, (cfg.vocab_size, D), "backbone.embeddings.weight")
        self.embed = emb.to(dtype).contiguous()  # (V, D)
        lm = emb if cfg.tie_word_embeddings else get("lm_head.weight")
        _check_shape(lm, (cfg.vocab_size, D), "lm_head.weight")
        self.lm_head_t = as_t(lm, dtype)  # (D, V)
        self.norm_f = get("backbone.norm_f.weight").to(dtype)
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"backbone.layers.{i}."
            m = p + "mixer."
            shapes = {"in_proj.weight": (2 * I, D), "conv1d.weight": (I, 1, K), "x_proj.weight": (R + 2 * N, I),
                      "dt_proj.weight": (I, R), "A_log": (I, N), "D": (I,), "out_proj.weight": (D, I)}
            for name, shape in shapes.items():
                _check_shape(get(m + name), shape, m + name)
            self.layers.append({
                "norm": get(p + "norm.weight").to(dtype),
                "w_in": as_t(get(m + "in_proj.weight"), dtype),  # (D, 2I): x | z
                "b_in": get(m + "in_proj.bias").to(dtype) if cfg.use_bias else None,
                "w_conv": get(m + "conv1d.weight")[:, 0].t().to(dtype).contiguous(),  # (K, I), oldest tap first
                "b_conv": get(m + "conv1d.bias").to(dtype) if cfg.use_conv_bias else None,
                "w_x": as_t(get(m + "x_proj.weight"), dtype),  # (I, R + 2N): dt_low | B | C
                "w_dt": as_t(get(m + "dt_proj.weight"), dtype),  # (R, I)
                # transformers casts these to fp32 at use; rounding through dtype first keeps bf16 faithful
                "b_dt": get(m + "dt_proj.bias").to(dtype).to(sdt),
                "A": -torch.exp(get(m + "A_log").to(dtype).to(sdt)),  # (I, N)
                "D": get(m + "D").to(dtype).to(sdt),
                "w_out": as_t(get(m + "out_proj.weight"), dtype),  # (I, D)
                "b_out": get(m + "out_proj.bias").to(dtype) if cfg.use_bias else None,
            })

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"family": "mamba", "layers": c.num_layers, "hidden": c.hidden_size, "state": f"{c.intermediate_size}x{c.state_size}",
                "vocab": c.vocab_size, "dtype": str(self._dtype).replace("torch.", "")}

    def new_cache(self, capacity: int) -> MambaState:
        return MambaState([L["A"] for L in self.layers], self.cfg.conv_kernel, capacity, self._dtype)

    # ---- the contract ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], chunk: int = 64) -> None:
        """Commit ``ids``: chunks of an exact sequential scan from the committed state (the
        chunk bounds the (T, I, N) scan buffers and the activations kept for rollback)."""
        ids = list(ids)
        self.cache.clear_scratch()
        for s in range(0, len(ids), chunk):
            part = ids[s:s + chunk]
            self._forward(part, list(range(-1, len(part) - 1)), mode="commit")

    @torch.inference_mode()
    def verify(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Logits (T, V) of a packed tree on top of the committed state, which stays unchanged;
        the nodes' activations are kept for commit()."""
        self.cache.clear_scratch()
        return self._forward(tokens, parents, mode="verify")

    def extend(self, tokens: Sequence[int], parents: Sequence[int], want_logits: bool = True) -> torch.Tensor | None:
        raise NotImplementedError("Mamba cannot draft yet (extend/fork): use it as a target, or draft with n-grams or a transformer")

    @torch.inference_mode()
    def commit(self, rows: Sequence[int]) -> None:
        self.cache.commit(rows)

    @torch.inference_mode()
    def rollback(self, length: int) -> None:
        self.cache.rollback(length)

    # ---- internals ------------------------------------------------------------------------------------
    def _forward(self, tokens: Sequence[int], parents: Sequence[int], mode: str) -> torch.Tensor | None:
        """mode "verify": keep activations in scratch, return logits. "commit": ``parents`` is a
        chain; its end state becomes the committed state (prefill)."""
        c, cache = self.cfg, self.cache
        T = len(tokens)
        if T == 0 or len(parents) != T:
            raise ValueError(f"forward needs matching non-empty tokens and parents ({T} vs {len(parents)})")
        if cache.length + T > cache.capacity:
            raise OverflowError("context full")
        levels, win = tree_plan(parents, c.conv_kernel)
        I, N, R, sdt = c.intermediate_size, c.state_size, c.time_step_rank, self.scan_dtype
        res = self.embed[torch.as_tensor(tokens, dtype=torch.long)]  # (T, D)
        if c.residual_in_fp32:
            res = res.to(self.scan_dtype)
        acts, new_conv, new_ssm = [], [], []
        for l, L in enumerate(self.layers):
            h = rms_norm(res.to(self._dtype), L["norm"], c.layer_norm_epsilon)
            xz = h @ L["w_in"]
            if L["b_in"] is not None:
                xz = xz + L["b_in"]
            xpre, z = xz[:, :I], xz[:, I:]  # (T, I) each
            # depthwise causal conv over each row's ancestor window (ALGORITHMS.md §5 "Conv1d")
            seq = torch.cat([cache.conv[l], xpre])  # (K-1+T, I): committed inputs, then the rows
            x = torch.einsum("tki,ki->ti", seq[win], L["w_conv"])  # windows (T, K, I)
            if L["b_conv"] is not None:
                x = x + L["b_conv"]
            x = F.silu(x)
            proj = x @ L["w_x"]  # (T, R + 2N)
            dt_low, B, C = proj[:, :R], proj[:, R:R + N], proj[:, R + N:]
            dt = F.softplus((dt_low @ L["w_dt"]).to(sdt) + L["b_dt"])  # (T, I) scan dtype
            S = selective_scan(x, dt, B, L["A"], cache.ssm[l], levels)  # (T, I, N)
            y = torch.einsum("tin,tn->ti", S, C.to(sdt)) + L["D"] * x.to(sdt)
            y = y * F.silu(z.to(sdt))
            out = y.to(self._dtype) @ L["w_out"]
            if L["b_out"] is not None:
                out = out + L["b_out"]
            res = res + out
            acts.append({"xpre": xpre, "x": x, "dt": dt, "B": B})
            if mode == "commit":
                new_ssm.append(S[-1].clone())  # (I, N): the chain's end
                new_conv.append(seq[T:].clone())  # (K-1, I): the last K-1 inputs
        if mode == "commit":
            cache.advance(new_conv, new_ssm, acts)
            return None
        cache.parents, cache.acts = list(parents), acts
        h = rms_norm(res, self.norm_f, c.layer_norm_epsilon)
        return h.to(self._dtype) @ self.lm_head_t  # (T, V)
