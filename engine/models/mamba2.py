"""Mamba-2 family: HF-format `mamba2` checkpoints and the original mamba_ssm format. One page;
generation logic lives in engine/generate.py.

The target-side algorithms are the point of this page:
  * verify = the STree tree scan (stree-hybrid-ssm-tree-decoding.txt §3; ALGORITHMS.md §5;
    reference/models.md §5.3): Mamba-2's quadratic SSD form with the causal mask replaced by the
    tree (ancestor) mask, cumulative log-decays summed along ancestors, conv windows gathered along
    ancestors and the committed conv state past the root. One pass, one state, no repeated tokens.
    A chain is the special case of a lower-triangular mask.
  * commit = activation replay (snakes-and-ladders-ssm-sd.txt §3.1): verify caches every node's
    post-conv x, B, dt (and pre-conv xBC); commit runs only the state recursion over the accepted
    chain from the committed state and rolls the conv state along it. No projections recomputed.
  * fork(n) / DraftBatch.step = drafting (mamba-drafters §4.1): n rows copy the committed
    state and step by the plain recurrence, batched over rows (engine/ssm_cache.py).

Devices: the model lives where its weights are; caches and index tensors follow it. On CUDA the
mixer runs the Triton ops of engine/kernels/ (kernels.use_triton: the tree conv, the tree scan — or the
fused multi-step update when the new nodes are one chain — the activation replay of commit, and
the drafter's one-token update in place); on a CPU the PyTorch code below, unchanged. With CUDA
graphs on (engine/cuda_graphs.py) the drafter's batched step and a fresh tree's verify pass are
replayed from graphs, one per batch size / tree size.

Shape letters: T new nodes this call, S all scratch nodes (S >= T, extend appends), D model width,
H heads, P head dim, G groups (B/C shared by H/G heads), R = H/G, N state size, K conv kernel,
C = conv channels (H·P + 2·G·N), I = H·P, V vocabulary, L layers. Batch is 1: trees are packed
along T; only draft rows (B) form a batch. Weights are stored transposed ([in, out]) for fast small-row GEMMs (common.as_t).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from engine.kernels import use_triton

from .. import cuda_graphs
from ..errors import ModelLoadError
from ..ssm_cache import DraftBatch, RecurrentCache, take
from .base import CausalLM
from .common import embed_rows, as_t, mm, require, rms_norm, rows_fast, tensor_getter

MODEL_TYPES = ("mamba2",)
DEFAULT_CAPACITY = 1 << 20  # an SSM has no context limit; this only bounds the decode loop's accounting
ADVANCE_ROWS = 256  # most catch-up tokens a C call of advance_fast takes


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------
@dataclass
class Mamba2Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int = 1
    conv_kernel: int = 4
    use_bias: bool = False
    use_conv_bias: bool = True
    norm_eps: float = 1e-5  # the block norms and norm_f
    gate_norm_eps: float = 1e-5  # the mixer's gated RMSNorm (mamba_ssm fixes it at 1e-5)
    dt_limit: tuple[float, float] = (0.0, math.inf)
    tie_word_embeddings: bool = False
    model_type: str = "mamba2"

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.state_size

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> "Mamba2Config":
        """transformers' Mamba2Config keys; missing optional keys take transformers' defaults."""
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported for mamba2 (silu)")
        hidden = config_int(cfg, "hidden_size", where)
        heads, head_dim = config_int(cfg, "num_heads", where), config_int(cfg, "head_dim", where)
        expand = config_int(cfg, "expand", where, 2)
        if hidden * expand != heads * head_dim:
            raise ModelLoadError(f"{where}: hidden_size*expand ({hidden * expand}) must equal num_heads*head_dim ({heads * head_dim})")
        eps = float(require(cfg, "layer_norm_epsilon", where)) if "layer_norm_epsilon" in cfg else 1e-5
        return cls(
            vocab_size=config_int(cfg, "vocab_size", where),
            hidden_size=hidden,
            num_layers=config_int(cfg, "num_hidden_layers", where),
            num_heads=heads,
            head_dim=head_dim,
            state_size=config_int(cfg, "state_size", where),
            n_groups=config_int(cfg, "n_groups", where, 8),
            conv_kernel=config_int(cfg, "conv_kernel", where, 4),
            use_bias=bool(cfg.get("use_bias", False)),
            use_conv_bias=bool(cfg.get("use_conv_bias", True)),
            norm_eps=eps,
            gate_norm_eps=eps,
            dt_limit=parse_dt_limit(cfg.get("time_step_limit"), where),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        ).checked(where)

    @classmethod
    def from_mamba_ssm(cls, cfg: dict[str, Any], where: str = "config.json") -> "Mamba2Config":
        """The original state-spaces/mamba2-* config (d_model, n_layer, ssm_cfg, ...;
        reference/models.md §2.2). Defaults are mamba_ssm's Mamba2.__init__ ones. Pair with
        ``remap_mamba_ssm_state_dict``; the model takes its vocabulary from the embedding's rows."""
        ssm = cfg.get("ssm_cfg") or {}
        if not isinstance(ssm, dict):
            raise ModelLoadError(f"{where}: ssm_cfg must be an object")
        if ssm.get("layer", "Mamba1") != "Mamba2":
            raise ModelLoadError(f"{where}: ssm_cfg.layer is {ssm.get('layer', 'Mamba1')!r}; this is the Mamba-2 loader")
        unsupported = [why for bad, why in [
            (cfg.get("attn_layer_idx"), "attention layers (attn_layer_idx, e.g. mamba2attn)"),
            (cfg.get("d_intermediate", 0), "MLP blocks (d_intermediate > 0)"),
            (not cfg.get("rms_norm", True), "LayerNorm blocks (rms_norm false)"),
            (not ssm.get("rmsnorm", True), "an ungated-norm mixer (ssm_cfg.rmsnorm false)"),
            (ssm.get("norm_before_gate", False), "norm_before_gate"),
        ] if bad]
        if unsupported:
            raise ModelLoadError(f"{where}: mamba_ssm checkpoint with {', '.join(unsupported)} is not supported")
        d_model = config_int(cfg, "d_model", where)
        sw = f"{where} ssm_cfg"
        d_inner = config_int(ssm, "expand", sw, 2) * d_model
        head_dim = config_int(ssm, "headdim", sw, 64)
        if d_inner % head_dim or ssm.get("d_ssm") not in (None, d_inner):
            raise ModelLoadError(f"{where}: expand*d_model ({d_inner}) must be a multiple of headdim ({head_dim}) and equal d_ssm")
        vocab, pad = config_int(cfg, "vocab_size", where), config_int(cfg, "pad_vocab_size_multiple", where, 8)
        return cls(
            vocab_size=-(-vocab // pad) * pad,  # MambaLMHeadModel pads the embedding rows
            hidden_size=d_model,
            num_layers=config_int(cfg, "n_layer", where),
            num_heads=d_inner // head_dim,
            head_dim=head_dim,
            state_size=config_int(ssm, "d_state", sw, 128),
            n_groups=config_int(ssm, "ngroups", sw, 1),
            conv_kernel=config_int(ssm, "d_conv", sw, 4),
            use_bias=bool(ssm.get("bias", False)),
            use_conv_bias=bool(ssm.get("conv_bias", True)),
            norm_eps=float(cfg.get("norm_epsilon", 1e-5)),
            gate_norm_eps=1e-5,
            dt_limit=parse_dt_limit(ssm.get("dt_limit"), sw),
            tie_word_embeddings=bool(cfg.get("tie_embeddings", True)),
        ).checked(where)

    def checked(self, where: str) -> "Mamba2Config":
        if self.num_heads % self.n_groups:
            raise ModelLoadError(f"{where}: num_heads {self.num_heads} is not a multiple of n_groups {self.n_groups}")
        if not 0 < self.norm_eps < 1:
            raise ModelLoadError(f"{where}: norm epsilon {self.norm_eps!r} is absurd")
        return self


def remap_mamba_ssm_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mamba_ssm names -> transformers names: only the embedding differs (backbone.embedding ->
    backbone.embeddings, as Mamba2Model.load_hook does); the mixer, norms and lm_head agree."""
    old = "backbone.embedding."
    return {("backbone.embeddings." + k[len(old):] if k.startswith(old) else k): v for k, v in sd.items()}


def config_int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    if default is not None and cfg.get(key) is None:
        return default
    val = require(cfg, key, where)
    if int(val) != val:
        raise ModelLoadError(f"{where}: config field {key!r} must be an integer, not {val!r}")
    return int(val)


def parse_dt_limit(val: Any, where: str) -> tuple[float, float]:
    if val is None:
        return (0.0, math.inf)
    try:
        # transformers 5.x writes inf as {"__float__": "Infinity"}; older files use the JSON literal
        lo, hi = (float(v["__float__"] if isinstance(v, dict) else v) for v in val)
    except (TypeError, ValueError, KeyError):
        raise ModelLoadError(f"{where}: time_step_limit/dt_limit {val!r} is not a pair of numbers") from None
    if not 0 <= lo < hi:
        raise ModelLoadError(f"{where}: time_step_limit/dt_limit {val!r} is absurd (need 0 <= min < max)")
    return (lo, hi)


# ---------------------------------------------------------------------------------------------
# State cache: committed state + scratch activations for activation replay
# ---------------------------------------------------------------------------------------------
IN_SPARE = "in spare"  # SSMCache._advance_state's ``state``: the spare buffers hold the new state already


class SSMCache(RecurrentCache):
    """Committed (conv, ssm) state per layer plus the scratch tree being verified.

    conv (L, C, K-1) raw xBC, newest last; ssm (L, H, P, N), fp32 always. Scratch activations per
    layer and node: xbc (raw, pre-conv: rolls the conv state on commit), x (H, P) post-conv,
    B (G, N), dt (H,) after softplus and clamp, la = dt·A (H,) the log decay. Bookkeeping, commit
    and rollback rules: engine/ssm_cache.RecurrentCache; the state before the last commit is
    kept in spare buffers, swapped not copied.
    """

    def __init__(self, n_layers: int, conv_dim: int, kernel: int, heads: int, head_dim: int, state: int,
                 capacity: int, dtype: torch.dtype, max_scratch: int = 512, device: torch.device | str | None = None,
                 A: torch.Tensor | None = None):
        super().__init__(n_layers, capacity, max_scratch)
        self.kernel = kernel
        self.conv = torch.zeros(n_layers, conv_dim, kernel - 1, dtype=dtype, device=device)  # (L, C, K-1) raw xBC, newest last
        self.ssm = torch.zeros(n_layers, heads, head_dim, state, dtype=torch.float32, device=device)  # (L, H, P, N), fp32 always
        self._spare_conv = torch.zeros_like(self.conv)  # the state before the last commit
        self._spare_ssm = torch.zeros_like(self.ssm)
        self.A = A  # (L, H) the layers' decay rates: the Triton replay takes dt and A, not dt·A (None: PyTorch replay)

    @classmethod
    def for_config(cls, c: Mamba2Config, capacity: int, dtype: torch.dtype, device: torch.device | str | None = None,
                   A: torch.Tensor | None = None) -> "SSMCache":
        """One state per mixer layer of ``c`` (c.num_layers of them)."""
        return cls(c.num_layers, c.conv_dim, c.conv_kernel, c.num_heads, c.head_dim, c.state_size, capacity, dtype,
                   device=device, A=A)

    def nbytes(self) -> int:
        return 2 * (self.conv.numel() * self.conv.element_size() + self.ssm.numel() * self.ssm.element_size())

    @torch.inference_mode()
    def add_nodes(self, parents: Sequence[int]) -> "TreePlan":
        """Place T scratch nodes (ScratchCache.place) and plan their forward (TreePlan): the
        ancestor mask over all S scratch nodes (S, S); for the T new nodes, the conv window idx
        (T, K) into the bank cat(conv state (K-1 columns), scratch xBC (S rows)), oldest first,
        walking up the tree and past the root into the committed columns; the scratch parents
        (S,) for the Triton ops; whether the S nodes form one chain.
        """
        T = len(parents)
        s0 = self.place(parents)
        S, k1 = s0 + T, self.kernel - 1
        # parent bank row of every bank row: committed column c -> c-1, a root child -> the newest column
        up = [max(c - 1, 0) for c in range(k1)] + [k1 + p if p >= 0 else k1 - 1 for p in self.scratch_parents]
        up = torch.tensor(up, dtype=torch.long).clamp_(min=0)
        idx = torch.empty(T, self.kernel, dtype=torch.long)
        idx[:, -1] = torch.arange(k1 + s0, k1 + S)
        for k in range(self.kernel - 2, -1, -1):
            idx[:, k] = up[idx[:, k + 1]]
        chain = all(p == i - 1 for i, p in enumerate(self.scratch_parents))
        return TreePlan(self._anc[:S, :S], idx, torch.tensor(self.scratch_parents, dtype=torch.long), T, chain)

    def _zero_state(self) -> None:
        self.conv.zero_()
        self.ssm.zero_()

    def _advance_state(self, path: list, state=None) -> None:
        """Replay the chain ``path`` from the committed state (the activations are all it takes)
        into the spare buffers and swap them in; ``state`` IN_SPARE: they hold it already (a
        graphed replay, a dense prefill)."""
        if state is not IN_SPARE:
            self.replay_into_spare(path)
        self._restore_state()

    def replay_into_spare(self, path: list) -> None:
        """The state after the chain ``path`` (per layer activations), replayed from the
        committed state into the spare buffers; the committed state is left as it was."""
        k1 = self.kernel - 1
        fused = self.A is not None and use_triton(self.ssm)
        for layer, a in enumerate(path):
            if fused:  # the multi-step update from the committed state, written into the spare buffer
                from engine.kernels.ssd_update import ssd_update

                ssd_update(self.ssm[layer][None], a["x"][None], a["B"][None], None, a["dt"][None], self.A[layer],
                           out=self._spare_ssm[layer][None])
            else:
                self._spare_ssm[layer] = replay_state(self.ssm[layer], a["x"], a["B"], a["dt"], a["la"])
            window = torch.cat([self.conv[layer], a["xbc"].t().to(self.conv.dtype)], dim=1)  # (C, K-1+m)
            self._spare_conv[layer] = window[:, window.shape[1] - k1:]

    @torch.inference_mode()
    def commit_graphed(self, rows: Sequence[int], graphs: "cuda_graphs.GraphSet") -> None:
        """``commit`` with the gather and the replay of every layer from one CUDA graph (Snakes
        and Ladders §3.3), where the scratch activations are a graphed verify pass's static
        buffers (``acts_key``): the graph reads them at fixed addresses, and the accepted rows
        come in as a device index. One graph per verify graph, accepted length and state buffer
        (the state alternates between two on commit). Otherwise the plain commit."""
        rows = self.chain_rows(rows)
        if not rows or self.acts_key is None:
            return self.commit(rows)
        m, acts = len(rows), list(self.acts)

        def replay(idx: torch.Tensor) -> list:
            path = take(acts, idx)
            self.replay_into_spare(path)
            return path

        key = ("commit", self.acts_key, m, self.ssm.data_ptr(), self.conv.data_ptr())
        path = graphs.run(key, replay, {"idx": self._on_device(rows)})
        # the path lives in the graph's output buffers until its next replay, which only a later
        # commit makes, and that commit replaces the undo record first
        self.advance([dict(a) for a in path], m, IN_SPARE)
        self.clear_scratch()

    def _restore_state(self) -> None:
        self.ssm, self._spare_ssm = self._spare_ssm, self.ssm
        self.conv, self._spare_conv = self._spare_conv, self.conv

    @torch.inference_mode()
    def adopt_spare(self, m: int) -> None:
        """Commit m tokens whose state a dense prefill wrote into the spare buffers: they become
        current, as one commit that no rollback enters (no activations were kept to replay)."""
        self.advance([], m, IN_SPARE)
        self._undo = None
        self.clear_scratch()


@dataclass
class TreePlan:
    """Where the T new scratch nodes of one forward hang (SSMCache.add_nodes), for every layer:
    anc (S, S) bool and conv_idx (T, K) for the PyTorch path, parents (S,) int64 (-1 = the root)
    for the Triton ops, and whether all S scratch nodes form one chain (the fused multi-step
    update then replaces the tree scan). Made on the host; ``to`` moves it to the model's device
    once per forward, not once per layer."""

    anc: torch.Tensor
    conv_idx: torch.Tensor
    parents: torch.Tensor
    T: int
    chain: bool

    @property
    def fresh(self) -> bool:
        """No scratch nodes before these (a verify or a prefill chunk, not an extend)."""
        return self.anc.shape[0] == self.T

    def to(self, device: torch.device) -> "TreePlan":
        if self.anc.device == device:
            return self
        return TreePlan(self.anc.to(device), self.conv_idx.to(device), self.parents.to(device), self.T, self.chain)


# ---------------------------------------------------------------------------------------------
# The two scans (pure functions)
# ---------------------------------------------------------------------------------------------
def tree_scan(C: torch.Tensor, x: torch.Tensor, B: torch.Tensor, dt: torch.Tensor, la: torch.Tensor,
              anc: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """SSM outputs (without the D skip) of the last T of S scratch nodes: STree §3 "tree decoding
    with SSMs", written out in ALGORITHMS.md §5 / reference/models.md §5.3:

        s_i = Σ_{k anc-or-self of i} dt_k·A        (cumulative log-decay along the root path)
        y_i = Σ_{j anc-or-self of i} exp(s_i - s_j)·(C_i·B_j)·dt_j·x_j  +  exp(s_i)·(S0·C_i)

    i.e. Mamba-2's SSD quadratic form (ssd_minimal_discrete's diagonal block) with the causal
    mask replaced by the ancestor mask and a non-zero initial state S0.

    C (T, G, N) of the query nodes; x (S, H, P), B (S, G, N), dt (S, H), la = dt·A (S, H) of all
    scratch nodes; anc (S, S) bool; state (H, P, N) committed. Returns (T, H, P), fp32.
    """
    S, H, P = x.shape
    T, G, N = C.shape
    R = H // G
    # Path sums in fp64: s_i - s_j of two nearby nodes is a small difference of two large sums
    # (|s| grows with depth), which in fp32 costs ~|s|·6e-8 of relative error in the most recent,
    # largest terms; transformers' segment_sum avoids the subtraction for the same reason.
    cum = anc.double() @ la.double()  # (S, H)
    q = cum[S - T:]  # (T, H)
    seg = (q.t()[:, :, None] - cum.t()[:, None, :]).float()  # (H, T, S): s_i - s_j
    # Mask with -inf before exp: off-tree differences can be large and positive.
    decay = seg.masked_fill(~anc[S - T:], float("-inf")).exp()  # (H, T, S)
    CB = torch.einsum("tgn,sgn->gts", C, B)  # (G, T, S)
    M = decay.view(G, R, T, S) * CB[:, None] * dt.t().reshape(G, R, 1, S)  # (G, R, T, S)
    y = M @ x.permute(1, 0, 2).reshape(G, R, S, P)  # (G, R, T, P)
    y_state = C.permute(1, 0, 2)[:, None] @ state.view(G, R, P, N).transpose(-1, -2)  # (G, R, T, P)
    y = y + y_state * q.t().float().exp().reshape(G, R, T, 1)
    return y.reshape(H, T, P).transpose(0, 1)  # (T, H, P)


def replay_state(state: torch.Tensor, x: torch.Tensor, B: torch.Tensor, dt: torch.Tensor, la: torch.Tensor) -> torch.Tensor:
    """Activation replay (snakes-and-ladders §3.1): the recurrence S_t = exp(dt_t·A)·S_{t-1} +
    dt_t·x_t⊗B_t over an accepted chain of m nodes, unrolled into one contraction:

        S_m = exp(Σ_t la_t)·S_0 + Σ_t exp(Σ_{k>t} la_k)·dt_t·x_t⊗B_t

    state (H, P, N) fp32; x (m, H, P); B (m, G, N); dt, la (m, H). Returns (H, P, N).
    """
    H = x.shape[1]
    c = la.double().cumsum(0)  # (m, H), fp64 for the differences below (see tree_scan)
    w = (c[-1] - c).float().exp() * dt  # (m, H): decay from node t to the chain's end, times dt_t
    Bh = B.repeat_interleave(H // B.shape[1], dim=1)  # (m, H, N): head h reads group h // R
    return c[-1].float().exp()[:, None, None] * state + torch.einsum("mh,mhp,mhn->hpn", w, x, Bh)


# ---------------------------------------------------------------------------------------------
# The mixer (one layer's SSM block) and the model
# ---------------------------------------------------------------------------------------------
class Mamba2Mixer:
    """One Mamba-2 mixer: in_proj -> conv -> SSM -> gated RMSNorm -> out_proj, over a packed tree
    (``__call__``: tree conv + STree scan) or over a batch of draft rows (``step``: the plain
    recurrence). Mamba2 stacks them; so does the Granite-4.0-H hybrid (granite_hybrid.py), whose
    ``mamba.*`` tensors have the same names under another prefix."""

    def __init__(self, c: Mamba2Config, get, prefix: str, dtype: torch.dtype):
        Dm, H, P, I, Cd, K = c.hidden_size, c.num_heads, c.head_dim, c.d_inner, c.conv_dim, c.conv_kernel
        self.c, self.dtype = c, dtype
        D = get(prefix + "D").float()
        if D.numel() not in (H, I):  # (H,) or mamba_ssm's D_has_hdim (H*P,)
            raise ModelLoadError(f"tensor {prefix}D has shape {tuple(D.shape)}, config implies ({H},)")
        self.w_in = as_t(get(prefix + "in_proj.weight", (I + Cd + H, Dm)), dtype)  # (D, I + C + H): z | xBC | dt
        self.b_in = get(prefix + "in_proj.bias", (I + Cd + H,)).to(dtype) if c.use_bias else None
        self.conv_w = get(prefix + "conv1d.weight", (Cd, 1, K))[:, 0].t().to(dtype).contiguous()  # (K, C), oldest tap first
        self.conv_b = get(prefix + "conv1d.bias", (Cd,)).to(dtype) if c.use_conv_bias else None
        self.dt_bias = get(prefix + "dt_bias", (H,)).float()
        self.A = -torch.exp(get(prefix + "A_log", (H,)).float())  # (H,) scalar per head, < 0
        self.D = D.reshape(H, -1).expand(H, P).contiguous()  # (H, P)
        self.gate_norm = get(prefix + "norm.weight", (I,)).float()
        self.w_out = as_t(get(prefix + "out_proj.weight", (Dm, I)), dtype)
        self.b_out = get(prefix + "out_proj.bias", (Dm,)).to(dtype) if c.use_bias else None

    def __call__(self, h: torch.Tensor, cache: SSMCache, layer: int, plan: TreePlan) -> torch.Tensor:
        """h (T, D) normed input of the T new nodes -> (T, D); stores their activations in
        ``cache`` slot ``layer``. plan: from cache.add_nodes for this call, on h's device."""
        z, xbc, dt = self._project(h)
        old = cache.acts[layer]
        if old is None and use_triton(h):  # a fresh tree on CUDA: the Triton ops (an extend keeps the path below)
            return self._output(self._tree_triton(cache, layer, plan, xbc, dt), z)
        # Depthwise causal conv along each node's root path (ancestor-gathered windows).
        bank = torch.cat([cache.conv[layer].t(), xbc] if old is None else [cache.conv[layer].t(), old["xbc"], xbc])  # (K-1+S, C)
        xs, B, C, dt = self._activate((bank[plan.conv_idx] * self.conv_w).sum(1), dt)  # (T, K, C) -> (T, C)
        a = cache.store(layer, {"xbc": xbc, "x": xs, "B": B, "dt": dt, "la": dt * self.A})
        y = tree_scan(C, a["x"], a["B"], a["dt"], a["la"], plan.anc, cache.ssm[layer]) + self.D * xs  # (T, H, P)
        return self._output(y, z)

    def _tree_triton(self, cache: SSMCache, layer: int, plan: TreePlan, xbc: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        """``__call__``'s conv and scan by the Triton ops, for the T nodes of a fresh scratch tree:
        tree_conv1d walks each node's ancestors in place (no gathered (T, K, C) windows), then one
        chain takes the fused multi-step update (state in registers), any other tree the tree scan
        (STree §3). Returns y (T, H, P) fp32 with the D skip."""
        from engine.kernels.ssd_update import ssd_update
        from engine.kernels.tree_conv1d import tree_conv1d
        from engine.kernels.tree_scan import tree_scan as tree_scan_kernel

        state = cache.ssm[layer]
        xs, B, C, dt = self._activate(tree_conv1d(cache.conv[layer], xbc, self.conv_w, self.conv_b, plan.parents), dt, biased=True)
        cache.store(layer, {"xbc": xbc, "x": xs, "B": B, "dt": dt, "la": dt * self.A})
        if plan.chain:
            y = ssd_update(state[None], xs[None], B[None], C[None], dt[None], self.A)[0][0]
        else:
            y = tree_scan_kernel(state, xs, B, C, dt, self.A, plan.parents)
        return y + self.D * xs  # (T, H, P)

    def prefill_chain(self, h: torch.Tensor, cache: SSMCache, layer: int, backend: str) -> torch.Tensor:
        """A long prefill's chunk through this mixer by dense kernels (engine/kernels/causal_conv.py,
        engine/kernels/chunk_scan.py: mamba_ssm's on CUDA, ``backend="ref"`` in tests): h (T, D) normed
        input of a chain continuing the committed state of ``layer`` -> (T, D); the state after
        the chain goes to the cache's spare buffers (SSMCache.adopt_spare makes it current). Keeps
        no activations: nothing replays a prefill."""
        from engine.kernels.causal_conv import causal_conv
        from engine.kernels.chunk_scan import chunk_scan

        z, xbc, dt = self._project(h)
        conv_y, new_conv = causal_conv(cache.conv[layer], xbc, self.conv_w, self.conv_b, backend)
        xs, B, C, dt = self._activate(conv_y, dt, biased=True)
        y, final = chunk_scan(cache.ssm[layer], xs, B, C, dt, self.A, backend)
        cache._spare_conv[layer].copy_(new_conv)
        cache._spare_ssm[layer].copy_(final)
        return self._output(y + self.D * xs, z)

    def step(self, h: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per draft row (mamba-drafters §4.1): h (B, D) normed input -> (B, D). The rows'
        conv (B, C, K-1) and ssm (B, H, P, N) states advance in place by the plain recurrence
        S = exp(dt·A)·S + dt·x⊗B, y = S·C + D·x."""
        z, xbc, dt = self._project(h)
        window = torch.cat([conv, xbc[:, :, None]], dim=2)  # (B, C, K): the last K-1 inputs, then this one
        xs, B, C, dt = self._activate((window.transpose(1, 2) * self.conv_w).sum(1), dt)
        conv.copy_(window[:, :, 1:])
        if use_triton(h):  # one fused pass over the state, in place (engine/kernels/ssd_update.py with out=state)
            from engine.kernels.ssd_update import ssd_update

            y = ssd_update(ssm, xs[:, None], B[:, None], C[:, None], dt[:, None], self.A, out=ssm)[0][:, 0]
            return self._output(y + self.D * xs, z)
        R = self.c.num_heads // self.c.n_groups
        Bh, Ch = B.repeat_interleave(R, dim=1), C.repeat_interleave(R, dim=1)  # (B, H, N): head h reads group h // R
        # in place, no (B, H, P, N) temporary: the state is the big tensor here (H·P·N per row and layer)
        ssm.mul_(torch.exp(dt * self.A)[:, :, None, None]).addcmul_((dt[:, :, None] * xs)[..., None], Bh[:, :, None, :])
        y = (ssm @ Ch[..., None])[..., 0] + self.D * xs  # (B, H, P)
        return self._output(y, z)

    def _project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T, D) -> z (T, I), raw xBC (T, C), raw dt (T, H)."""
        zxbcdt = mm(h, self.w_in)
        if self.b_in is not None:
            zxbcdt = zxbcdt + self.b_in
        return zxbcdt.split([self.c.d_inner, self.c.conv_dim, self.c.num_heads], dim=-1)

    def _activate(self, conv: torch.Tensor, dt: torch.Tensor, biased: bool = False) -> tuple[torch.Tensor, ...]:
        """Conv output (T, C) (``biased``: the conv bias is in already) and raw dt (T, H) -> x
        (T, H, P), B, C (T, G, N), dt (T, H), fp32."""
        c = self.c
        T = conv.shape[0]
        if self.conv_b is not None and not biased:
            conv = conv + self.conv_b
        xs, B, C = F.silu(conv).float().split([c.d_inner, c.n_groups * c.state_size, c.n_groups * c.state_size], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias).clamp(*c.dt_limit)  # (T, H)
        return xs.reshape(T, c.num_heads, c.head_dim), B.reshape(T, c.n_groups, -1), C.reshape(T, c.n_groups, -1), dt

    def _output(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm (gate before norm, per group of I/G channels, fp32 as transformers does)
        and out_proj: y (T, H, P) fp32, z (T, I) -> (T, D)."""
        c = self.c
        T, I, G = y.shape[0], c.d_inner, c.n_groups
        y = y.reshape(T, I) * F.silu(z.float())
        yg = y.view(T, G, I // G)
        y = (yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + c.gate_norm_eps)).view(T, I) * self.gate_norm
        out = mm(y.to(self.dtype), self.w_out)
        return out if self.b_out is None else out + self.b_out


class Mamba2(CausalLM):
    family = "mamba2"

    def __init__(self, cfg: Mamba2Config, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, max_context: int | None = None):
        super().__init__()
        self.cfg = cfg
        self._dtype = dtype
        self.max_context = max_context or DEFAULT_CAPACITY
        Dm = cfg.hidden_size
        get = tensor_getter(sd, "Mamba-2")
        emb = get("backbone.embeddings.weight")
        V = emb.shape[0]  # the tensor, not the config: mamba_ssm pads the rows (reference/models.md §2.2)
        if emb.dim() != 2 or emb.shape[1] != Dm or V < cfg.vocab_size:
            raise ModelLoadError(f"tensor backbone.embeddings.weight has shape {tuple(emb.shape)}, config implies ({cfg.vocab_size}, {Dm})")
        self.embed = emb.to(dtype).contiguous()  # (V, D)
        lm = None if cfg.tie_word_embeddings else sd.get("lm_head.weight")
        self.lm_head_t = as_t(emb if lm is None else get("lm_head.weight", (V, Dm)), dtype)  # (D, V)
        self.norm_f = get("backbone.norm_f.weight", (Dm,)).to(dtype)
        self.layers = [(get(f"backbone.layers.{i}.norm.weight", (Dm,)).to(dtype), Mamba2Mixer(cfg, get, f"backbone.layers.{i}.mixer.", dtype))
                       for i in range(cfg.num_layers)]
        self.graphs = cuda_graphs.GraphSet.for_device(self.device) if cuda_graphs.ENABLED else None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def use_cuda_graphs(self, on: bool = True, emulate: bool = False) -> bool:
        """Replay the drafter's batched step and fresh verify passes from CUDA graphs
        (engine/cuda_graphs.py); on a CPU they stay eager unless ``emulate`` (tests). Returns
        whether graphs are on."""
        self.graphs = (cuda_graphs.GraphSet(self.device, emulate=True, warmup=1) if emulate
                       else cuda_graphs.GraphSet.for_device(self.device)) if on else None
        return self.graphs is not None

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"family": c.model_type, "layers": c.num_layers, "hidden": c.hidden_size, "heads": c.num_heads,
                "state": c.state_size, "groups": c.n_groups, "vocab": self.vocab_size, "dtype": str(self._dtype).replace("torch.", "")}

    def new_cache(self, capacity: int) -> SSMCache:
        return SSMCache.for_config(self.cfg, capacity, self._dtype, self.device, torch.stack([m.A for _, m in self.layers]))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return mm(hidden.to(self._dtype), self.lm_head_t)  # (T, V)

    def _prefill_dense(self, part: list[int], backend: str) -> None:
        """One prefill chunk by the dense chunked kernels (CausalLM.prefill decides when): each
        mixer writes the state after the chunk into the spare buffers (Mamba2Mixer.prefill_chain),
        which then become current as one commit no rollback enters (Decoder.start rebuilds a
        recurrent state from 0)."""
        cache = self.cache
        cache.place(list(range(-1, len(part) - 1)))  # the capacity check of every path
        cache.clear_scratch()
        x = embed_rows(self.embed, part).float()
        for i, (norm, mixer) in enumerate(self.layers):
            x = x + mixer.prefill_chain(rms_norm(x.to(self._dtype), norm, self.cfg.norm_eps), cache, i, backend)
        cache.adopt_spare(len(part))

    def commit(self, rows: Sequence[int]) -> None:
        """SSMCache.commit; with CUDA graphs on, after a graphed verify pass, from a graph too."""
        if self.graphs is not None:
            return self.cache.commit_graphed(rows, self.graphs)
        self.cache.commit(rows)

    # verify / extend / rollback come from CausalLM and SSMCache; this is the forward.
    def _run(self, tokens: Sequence[int], parents: Sequence[int], want_logits: bool) -> torch.Tensor | None:
        cache = self.cache
        plan = cache.add_nodes(parents)
        try:
            plan = plan.to(self.device)
            ids = torch.as_tensor(tokens, dtype=torch.long)
            if want_logits and plan.fresh and self.graphs is not None:
                return self._verify_graphed(ids, plan)
            x = self._forward(ids, plan)
        except BaseException:
            cache.clear_scratch()  # never leave half-stored activations behind
            raise
        if not want_logits:
            return None
        return self.logits(rms_norm(x, self.norm_f, self.cfg.norm_eps))

    def _forward(self, ids: torch.Tensor, plan: TreePlan) -> torch.Tensor:
        """Token ids (T,) -> the residual stream (T, D) fp32 after the last layer; the layers'
        activations land in the cache's scratch."""
        x = embed_rows(self.embed, ids).float()  # (T, D) residual stream, fp32
        for i, (norm, mixer) in enumerate(self.layers):
            x = x + mixer(rms_norm(x.to(self._dtype), norm, self.cfg.norm_eps), self.cache, i, plan)
        return x

    def _verify_graphed(self, ids: torch.Tensor, plan: TreePlan) -> torch.Tensor:
        """A fresh tree's verify pass from the CUDA graph of its size (engine/cuda_graphs.py); the
        tree itself (anc, conv windows, parents) is data in static buffers, so one graph serves
        every tree of T nodes — two, as the committed state alternates between two buffers."""
        cache = self.cache

        def verify(ids: torch.Tensor, anc: torch.Tensor, conv_idx: torch.Tensor, parents: torch.Tensor):
            cache.acts = [None] * len(cache.acts)  # every run stores a fresh tree's activations
            x = self._forward(ids, TreePlan(anc, conv_idx, parents, plan.T, plan.chain))
            return self.logits(rms_norm(x, self.norm_f, self.cfg.norm_eps)), list(cache.acts)

        key = ("verify", plan.T, plan.chain, cache.ssm.data_ptr(), cache.conv.data_ptr())
        logits, acts = self.graphs.run(key, verify, {"ids": ids, "anc": plan.anc, "conv_idx": plan.conv_idx, "parents": plan.parents})
        cache.acts = [dict(a) for a in acts]  # the graph's buffers: commit copies the accepted rows out
        cache.acts_key = key  # ... and may do so from a graph of its own (SSMCache.commit_graphed)
        return logits.clone()

    # ---- drafting (mamba-drafters §4.1) ---------------------------------------------------------------
    @torch.inference_mode()
    def fork(self, n: int) -> DraftBatch:
        """n draft rows, each a copy of the committed (conv, ssm) state; see ssm_cache.DraftBatch."""
        c = self.cache
        return DraftBatch.of_committed(self, c.draft_pool, n, {"conv": c.conv[:, None], "ssm": c.ssm[:, None]}, c.length)

    def _step_batch(self, batch: DraftBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (B,) -> logits (B, V); the rows' states advance in place. With CUDA
        graphs, one graph per batch buffers (depth and rows of the tree shape: DraftPool)."""
        conv, ssm = batch.state["conv"], batch.state["ssm"]  # (L, B, C, K-1), (L, B, H, P, N)
        if self.graphs is None:
            return self._step(conv, ssm, tokens)
        key = ("step", batch.rows, conv.data_ptr(), ssm.data_ptr())
        out = self.graphs.run(key, lambda tokens: self._step(conv, ssm, tokens), {"tokens": tokens}, mutated=(conv, ssm))
        return out.clone()

    def _step(self, conv: torch.Tensor, ssm: torch.Tensor, tokens: torch.Tensor, want_logits: bool = True) -> torch.Tensor | None:
        """One token per row through every block, the state updated in place; the logits (B, V),
        or None without ``want_logits`` (the head is most of a small drafter's step)."""
        x = embed_rows(self.embed, tokens).float()  # (B, D)
        lib = self._native_step(conv, ssm)
        if lib is not None:  # a drafter's step on a CPU: every block in one C call (engine/native/mamba2_step.c)
            x = self._c_layers(lib, x.contiguous(), tokens.shape[0], 1, conv, ssm)
        else:
            for i, (norm, mixer) in enumerate(self.layers):
                x = x + mixer.step(rms_norm(x.to(self._dtype), norm, self.cfg.norm_eps), conv[i], ssm[i])
        return self.logits(rms_norm(x, self.norm_f, self.cfg.norm_eps)) if want_logits else None

    @torch.inference_mode()
    def advance_fast(self, tokens: list[int]) -> torch.Tensor | None:
        """A drafter keeping up with the conversation: the committed state stepped through
        ``tokens`` in place by the C blocks (engine/native/mamba2_step.c: the projections over all
        the tokens at once, the recurrence one token at a time), and the last token's logits returned; None where the C step does not apply (then use verify /
        prefill). ~0.25 ms a token for the shipped drafter against ~1.6 ms for a torch verify pass
        of one token. Drafter numerics only (common.fast_rows), like every draft step. The commit
        keeps no activations, so a later rollback inside it rebuilds from 0 (the drafter's
        ``_recurrent_rollback``): drafters only roll back when the conversation is edited."""
        c = self.cache
        conv, ssm = c.conv[:, None], c.ssm[:, None]  # (L, 1, C, K-1), (L, 1, H, P, N): views of the state
        lib = self._native_step(conv, ssm) if tokens else None
        if lib is None or c.length + len(tokens) > c.capacity:
            return None
        c.clear_scratch()
        # the tokens in calls of up to ADVANCE_ROWS: in each, the projections over all of them at
        # once, the recurrence in order (the chunks bound the call's scratch: ~16 KB a token)
        for i in range(0, len(tokens), ADVANCE_ROWS):
            part = tokens[i:i + ADVANCE_ROWS]
            x = self._c_layers(lib, embed_rows(self.embed, part).float().contiguous(), 1, len(part), conv, ssm)
        c._undo = None
        c.length += len(tokens)
        return self.logits(rms_norm(x[-1:], self.norm_f, self.cfg.norm_eps))[0]

    def _c_layers(self, lib, x: torch.Tensor, B: int, T: int, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """x (B T, D) through every block by mamba2_layers_f32 (B rows of T tokens in order; the
        states (L, B, ...) stepped in place); returns x."""
        from .. import native

        c = self.cfg
        tab = self._c_layers_tab()
        rc = lib.mamba2_layers_f32(x.data_ptr(), B, T, c.hidden_size, tab.data_ptr(), len(self.layers), c.norm_eps,
                                   conv.data_ptr(), ssm.data_ptr(), c.conv_kernel, c.num_heads, c.head_dim, c.state_size,
                                   c.n_groups, c.gate_norm_eps, c.dt_limit[0], c.dt_limit[1], native.threads())
        if rc:
            raise MemoryError("mamba2 step scratch allocation failed")
        return x

    def draft_step_fast(self, batch: DraftBatch, token: int, k: int, width: int, view: torch.Tensor | None,
                        ids: torch.Tensor | None, want_p: bool = True) -> tuple[list[int], list[float] | None] | None:
        """One row's draft step wholly in C (engine/native/mamba2_step.c ``mamba2_draft_step``):
        ``token`` through every block, the head, and the top ``k`` of the softmax over the usable
        columns (``view``: indices into the ``width`` raw columns, or all of them; ``ids``: the
        token id of each usable column, or the index itself). Returns (ids, probabilities or None
        without ``want_p``) best first, the batch's row advanced; None where the C step does not apply (then use
        ``batch.step``). Drafter numerics (close to the torch path, not bit-equal), like every
        draft step; the ModelDrafter's greedy chains and hybrid:auto's Spine take it."""
        if batch.rows != 1 or batch.model is not self:
            return None
        conv, ssm = batch.state["conv"], batch.state["ssm"]
        lib = self._native_step(conv, ssm)
        if lib is None or not hasattr(self.lm_head_t, "native_weight"):
            return None
        tab = self._c_layers_tab()
        key = (width, view, ids, self.lm_head_t, self.embed, tab)  # compared by identity
        cached = self.__dict__.get("_c_draft")
        if cached is None or any(a is not b for a, b in zip(cached[0], key)):
            head = self.lm_head_t.native_weight()
            emb = self.embed
            if head is None or emb.dtype != torch.float32 or not emb.is_contiguous() or self.norm_f.dtype != torch.float32:
                self.__dict__["_c_draft"] = (key, None)
                return None
            c = self.cfg
            V = self.lm_head_t.shape[1]
            view64 = None if view is None else view.to(torch.int64).contiguous()
            ids64 = None if ids is None else ids.to(torch.int64).contiguous()
            mt = torch.tensor([c.hidden_size, len(self.layers), tab.data_ptr(), c.conv_kernel, c.num_heads,
                               c.head_dim, c.state_size, c.n_groups, emb.data_ptr(), self.norm_f.data_ptr(), head[0],
                               head[1], V, width, 0 if view64 is None else view64.data_ptr(),
                               width if view64 is None else view64.numel(), 0 if ids64 is None else ids64.data_ptr(),
                               emb.shape[0]],
                              dtype=torch.int64)
            mf = torch.tensor([c.norm_eps, c.gate_norm_eps, c.dt_limit[0], c.dt_limit[1], c.norm_eps], dtype=torch.float64)
            scratch = torch.empty(max(c.hidden_size, V) + c.hidden_size, dtype=torch.float32)
            out = (torch.empty(16, dtype=torch.int64), torch.empty(16, dtype=torch.float32))
            cached = self.__dict__["_c_draft"] = (key, (mt, mf, scratch, out, view64, ids64))  # key keeps the tables alive
        if cached[1] is None:
            return None
        from .. import native

        mt, mf, scratch, (oi, op), *_ = cached[1]
        rc = lib.mamba2_draft_step(mt.data_ptr(), mf.data_ptr(), conv.data_ptr(), ssm.data_ptr(), int(token), int(k),
                                   int(want_p), oi.data_ptr(), op.data_ptr(), scratch.data_ptr(), native.threads())
        if rc == 1:
            raise MemoryError("mamba2 draft step scratch allocation failed")
        if rc:
            return None
        batch.steps += 1
        return oi[:k].tolist(), op[:k].tolist() if want_p else None

    def draft_step_logits(self) -> torch.Tensor | None:
        """The raw logits (every head column) the last ``draft_step_fast`` left in its scratch: a
        view, valid until the next step (a sampled chain draws from them; engine/drafters/model.py)."""
        cached = self.__dict__.get("_c_draft")
        if cached is None or cached[1] is None:
            return None
        D = self.cfg.hidden_size
        return cached[1][2][D:D + self.lm_head_t.shape[1]]

    def _c_layers_tab(self) -> torch.Tensor:
        """The per-layer pointer table ``_c_layers`` hands the C blocks (built once)."""
        tab = self.__dict__.get("_c_tab")
        if tab is None:  # the weights' pointers, once (quantize_for_drafting drops it)
            rows = []
            for norm, m in self.layers:
                (wi, qi), (wo, qo) = m.w_in.native_weight(), m.w_out.native_weight()
                rows.append([norm.data_ptr(), wi, qi, m.conv_w.data_ptr(), 0 if m.conv_b is None else m.conv_b.data_ptr(),
                             m.dt_bias.data_ptr(), m.A.data_ptr(), m.D.data_ptr(), m.gate_norm.data_ptr(), wo, qo])
            tab = self.__dict__["_c_tab"] = torch.tensor(rows, dtype=torch.int64)
        return tab

    def quantize_for_drafting(self, act8: bool | None = None) -> int:
        """A drafter's fp32 projections and head in Q8_0 (engine/models/quant.py), a quarter of the
        bytes a draft step streams; ``act8`` (default: where the start-up probe finds the q8
        compute type's products faster, engine/dtype_probe.py) with 8-bit activations too
        (engine/native/quant_a8.c). Only for a drafter: its numbers choose proposals, never what
        is emitted (the verifier is exact for any q, and SLRS recomputes q from the same weights,
        row-consistently). Returns the number of weights converted."""
        if act8 is None:
            from ..dtype_probe import q8_faster

            act8 = q8_faster()
        n = 0
        for _, m in self.layers:
            for name in ("w_in", "w_out"):
                q = getattr(m, name).to_q8_0(act8)
                n += q is not getattr(m, name)
                setattr(m, name, q)
        q = self.lm_head_t.to_q8_0(act8)
        n += q is not self.lm_head_t
        self.lm_head_t = q
        self._c_block_weights = None
        self.__dict__.pop("_c_tab", None)
        self.__dict__.pop("_c_draft", None)
        return n

    def _native_step(self, conv: torch.Tensor, ssm: torch.Tensor):
        """The C block (engine/native/mamba2_step.c) where it applies: a drafter's call
        (common.fast_rows: its numbers need not be bit-equal to the torch path's, only close),
        fp32 on a CPU, weights in linear.c's layout, no projection biases, contiguous states."""
        if not (rows_fast() and self._dtype == torch.float32 and conv.device.type == "cpu" and self.graphs is None):
            return None
        if not (conv.is_contiguous() and ssm.is_contiguous() and conv.dtype == torch.float32):
            return None
        ok = getattr(self, "_c_block_weights", None)
        if ok is None:  # the weights never change layout: checked once, not every draft step
            ok = self._c_block_weights = all(m.w_in.native_weight() is not None and m.w_out.native_weight() is not None
                                             and m.b_in is None and m.b_out is None for _, m in self.layers)
        if not ok:
            return None
        from .. import native

        return native.lib()

