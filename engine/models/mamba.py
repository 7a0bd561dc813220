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
    fork(n) / step            drafting (mamba-drafters §4.1): n rows copy the committed state and
                             advance by the plain recurrence, batched over rows (ssm_cache.DraftBatch).

Shape letters: T rows this call (tokens / tree nodes), M rows committed by one commit, D model
width, I inner channels (d_inner = expand * D), N state size, R dt rank, K conv kernel, V vocab.
Batch is 1: trees are packed along T; only draft rows (B) form a batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..errors import ModelLoadError
from .base import CausalLM
from ..ssm_cache import DraftBatch, RecurrentCache
from .common import embed_rows, as_t, mm, require, rms_norm, tensor_getter

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
class MambaState(RecurrentCache):
    """Committed state of every layer plus the activations of the scratch tree.

    conv[l] (K-1, I): the last K-1 committed pre-conv inputs, oldest first (time-major, so tree
    windows are a row gather; transformers keeps (I, K)). ssm[l] (I, N): the SSM state, in the
    scan dtype of A (fp32; fp64 for an fp64 model).
    Scratch: per layer the tree nodes' pre-conv x, post-conv x, dt and B — all replay needs.
    Bookkeeping, commit and rollback rules: engine/ssm_cache.RecurrentCache (rollback reaches
    n == 0, n == length, or back into the last commit or prefill chunk: the decode loop cuts a
    step's tokens after an EOS). A commit makes fresh tensors, so the state before stays valid.
    """

    def __init__(self, A: list[torch.Tensor], kernel: int, capacity: int, dtype: torch.dtype):
        self.A = A  # per layer (I, N): replay needs the decay, nothing else of the weights
        self.dims = (len(A), A[0].shape[0], A[0].shape[1], kernel)
        self.dtype = dtype
        super().__init__(len(A), capacity)
        self._zero_state()
        self._prev: tuple[list, list] | None = None

    def _zero_state(self) -> None:
        Ly, I, N, K = self.dims
        self.conv = [torch.zeros(K - 1, I, dtype=self.dtype) for _ in range(Ly)]
        self.ssm = [torch.zeros(I, N, dtype=self.A[l].dtype) for l in range(Ly)]

    def _advance_state(self, path: list, state: tuple[list, list] | None = None) -> None:
        self._prev = (self.conv, self.ssm)
        self.conv, self.ssm = state if state is not None else _replay(self.conv, self.ssm, path, self.A)

    def _restore_state(self) -> None:
        self.conv, self.ssm = self._prev


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
        get = tensor_getter(sd, "Mamba")
        emb = get("backbone.embeddings.weight", (cfg.vocab_size, D))
        self.embed = emb.to(dtype).contiguous()  # (V, D)
        lm = emb if cfg.tie_word_embeddings else get("lm_head.weight", (cfg.vocab_size, D))
        self.lm_head_t = as_t(lm, dtype)  # (D, V)
        self.norm_f = get("backbone.norm_f.weight").to(dtype)
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"backbone.layers.{i}."
            m = p + "mixer."
            shapes = {"in_proj.weight": (2 * I, D), "conv1d.weight": (I, 1, K), "x_proj.weight": (R + 2 * N, I),
                      "dt_proj.weight": (I, R), "A_log": (I, N), "D": (I,), "out_proj.weight": (D, I)}
            for name, shape in shapes.items():
                get(m + name, shape)
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
        raise NotImplementedError("Mamba-1 drafts with fork/step (mamba-drafters §4.1), not by extending a scratch tree")

    @torch.inference_mode()
    def commit(self, rows: Sequence[int]) -> None:
        self.cache.commit(rows)

    @torch.inference_mode()
    def rollback(self, length: int) -> None:
        self.cache.rollback(length)

    # ---- drafting (mamba-drafters §4.1) ---------------------------------------------------------------
    @torch.inference_mode()
    def fork(self, n: int) -> DraftBatch:
        """n draft rows, each a copy of the committed (conv, ssm) state; see ssm_cache.DraftBatch."""
        c = self.cache
        committed = {"conv": torch.stack(c.conv)[:, None], "ssm": torch.stack(c.ssm)[:, None]}  # (L, 1, K-1, I), (L, 1, I, N)
        return DraftBatch.of_committed(self, c.draft_pool, n, committed, c.length)

    def _step_batch(self, batch: DraftBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (B,) -> logits (B, V); the rows' conv (L, B, K-1, I) and ssm
        (L, B, I, N) states advance in place: the plain Mamba recurrence, batched over rows."""
        sdt = self.scan_dtype
        res = embed_rows(self.embed, tokens)  # (B, D)
        if self.cfg.residual_in_fp32:
            res = res.to(sdt)
        for l, L in enumerate(self.layers):
            conv, S = batch.state["conv"][l], batch.state["ssm"][l]
            xpre, z = self._mix_in(L, res)
            window = torch.cat([conv, xpre[:, None]], dim=1)  # (B, K, I): the last K-1 inputs, then this one
            x, dt, B, C = self._mix_ssm_inputs(L, torch.einsum("bki,ki->bi", window, L["w_conv"]))
            conv.copy_(window[:, 1:])
            S.mul_(torch.exp(dt[:, :, None] * L["A"])).addcmul_((dt * x.to(sdt))[:, :, None], B.to(sdt)[:, None, :])
            res = res + self._mix_out(L, S, C, x, z)
        return self._head(res)

    # ---- internals ------------------------------------------------------------------------------------
    def _mix_in(self, L: dict, res: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual rows (T, D) -> pre-conv x and gate z, (T, I) each."""
        h = rms_norm(res.to(self._dtype), L["norm"], self.cfg.layer_norm_epsilon)
        xz = mm(h, L["w_in"])
        if L["b_in"] is not None:
            xz = xz + L["b_in"]
        I = self.cfg.intermediate_size
        return xz[:, :I], xz[:, I:]

    def _mix_ssm_inputs(self, L: dict, conv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Conv output (T, I) -> x (T, I), dt (T, I) scan dtype, B, C (T, N)."""
        R, N = self.cfg.time_step_rank, self.cfg.state_size
        x = conv if L["b_conv"] is None else conv + L["b_conv"]
        x = F.silu(x)
        proj = mm(x, L["w_x"])  # (T, R + 2N)
        dt_low, B, C = proj[:, :R], proj[:, R:R + N], proj[:, R + N:]
        dt = F.softplus(mm(dt_low, L["w_dt"]).to(self.scan_dtype) + L["b_dt"])
        return x, dt, B, C

    def _mix_out(self, L: dict, S: torch.Tensor, C: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """States (T, I, N) read out by C, D skip, gate, out_proj -> (T, D)."""
        sdt = self.scan_dtype
        y = torch.einsum("tin,tn->ti", S, C.to(sdt)) + L["D"] * x.to(sdt)
        y = y * F.silu(z.to(sdt))
        out = mm(y.to(self._dtype), L["w_out"])
        return out if L["b_out"] is None else out + L["b_out"]

    def _head(self, res: torch.Tensor) -> torch.Tensor:
        h = rms_norm(res, self.norm_f, self.cfg.layer_norm_epsilon)
        return mm(h.to(self._dtype), self.lm_head_t)  # (T, V)

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
        if mode == "verify":
            cache.place(parents)
        try:
            res = embed_rows(self.embed, tokens)  # (T, D)
            if c.residual_in_fp32:
                res = res.to(self.scan_dtype)
            acts, new_conv, new_ssm = [], [], []
            for l, L in enumerate(self.layers):
                xpre, z = self._mix_in(L, res)  # (T, I) each
                # depthwise causal conv over each row's ancestor window (ALGORITHMS.md §5 "Conv1d")
                seq = torch.cat([cache.conv[l], xpre])  # (K-1+T, I): committed inputs, then the rows
                x, dt, B, C = self._mix_ssm_inputs(L, torch.einsum("tki,ki->ti", seq[win], L["w_conv"]))  # windows (T, K, I)
                S = selective_scan(x, dt, B, L["A"], cache.ssm[l], levels)  # (T, I, N)
                res = res + self._mix_out(L, S, C, x, z)
                acts.append({"xpre": xpre, "x": x, "dt": dt, "B": B})
                if mode == "commit":
                    new_ssm.append(S[-1].clone())  # (I, N): the chain's end
                    new_conv.append(seq[T:].clone())  # (K-1, I): the last K-1 inputs
        except BaseException:
            cache.clear_scratch()  # never leave nodes without activations behind
            raise
        if mode == "commit":
            cache.advance(acts, T, (new_conv, new_ssm))
            return None
        for l, a in enumerate(acts):
            cache.store(l, a)
        return self._head(res)
