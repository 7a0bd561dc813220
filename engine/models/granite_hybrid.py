"""Granite-4.0-H (`granitemoehybrid`, the dense variants): Mamba-2 mixer layers and NoPE GQA
attention layers at listed depths, each followed by a SwiGLU MLP, with Granite's four scalar
multipliers (reference/models.md §1.2). One page; generation logic lives in engine/generate.py.

    x = embed(ids) · embedding_multiplier
    per layer:  x += residual_multiplier · Mixer(RMSNorm(x))     Mixer = Mamba-2, or attention with
                                                                 scores scaled by attention_multiplier
                x += residual_multiplier · MLP(RMSNorm(x))       MLP = output_linear(silu(g)·u), g|u = input_linear(·)
    logits = lm_head(RMSNorm(x)) / logits_scaling

A hybrid is just layers of both kinds, so everything is borrowed: the Mamba-2 mixer, its state
cache, the STree tree scan and activation replay from mamba2.py, the K/V cache with the tree mask
from engine/cache.py. verify is one pass over the packed tree (ALGORITHMS.md §5 "Hybrid": Mamba
layers scan the tree-masked SSD form from the committed state, attention layers use the tree mask
over [committed K/V ; tree nodes]); commit replays the accepted chain in the Mamba layers and
compacts its K/V rows in the attention layers.
As a drafter (mamba-drafters §4.1) it forks like a Mamba: n rows copy the Mamba layers' state,
and in the attention layers every row reads the committed K/V prefix in place and keeps its own
small K/V tail of the tokens it stepped (engine/ssm_cache.DraftBatch).
On CUDA the Mamba layers run mamba2.py's Triton dispatch; the attention layers keep their
PyTorch path (the CPU's C kernel is never asked for), with the mask and plan moved to the device.
With CUDA graphs on, a fresh tree's verify pass replays each run of consecutive Mamba layers
(with their MLPs) from a graph per tree size, and the attention layers between run eagerly:
their committed prefix grows every step, so it has no fixed shape to record.

Shape letters: T new nodes, D model width, H query heads, K kv heads, E head dim, F MLP width,
V vocabulary (the Mamba-side letters are mamba2.py's). Batch is 1: trees are packed along T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .. import cuda_graphs
from ..cache import KVCache
from ..errors import ModelLoadError
from ..ssm_cache import DraftBatch, DraftPool
from .base import CausalLM
from .common import embed_rows, AttnPlan, as_t, attn_plan, cached_attention, context_limit, mm, require, rms_norm, Rope, rope_params, tensor_getter
from .mamba2 import Mamba2Config, Mamba2Mixer, SSMCache, TreePlan, config_int, parse_dt_limit

MODEL_TYPES = ("granitemoehybrid",)
LAYER_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


@dataclass
class GraniteHybridConfig:
    vocab_size: int
    hidden_size: int
    layer_kinds: tuple[str, ...]  # "mamba" | "attention" per layer
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_size: int  # shared_intermediate_size
    mamba: Mamba2Config  # the mixer's dimensions; num_layers = the number of Mamba layers
    rms_norm_eps: float = 1e-6
    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0  # the attention scale itself, not 1/sqrt(E)
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0  # logits are divided by it
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope: dict[str, Any] | None = None  # None = NoPE (granite-4.0-h); else rope_params of the config
    model_type: str = "granitemoehybrid"

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], where: str = "config.json") -> "GraniteHybridConfig":
        """transformers' GraniteMoeHybridConfig keys; a missing optional key takes its default there."""
        experts = cfg.get("num_local_experts", 8)  # absent = transformers' default, 8 experts
        if experts:
            raise ModelLoadError(f"{where}: num_local_experts is {experts}: MoE variants are not supported (dense granite-4.0-h only)")
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported for granitemoehybrid (silu)")
        n_layers = config_int(cfg, "num_hidden_layers", where)
        raw = cfg.get("layer_types") or cfg.get("layers_block_type") or ["mamba"] * n_layers  # transformers: all Mamba
        if not isinstance(raw, list) or len(raw) != n_layers or any(k not in LAYER_KINDS for k in raw):
            raise ModelLoadError(f"{where}: layer_types must list {n_layers} entries of {sorted(LAYER_KINDS)}, not {raw!r}")
        kinds = tuple(LAYER_KINDS[k] for k in raw)
        pos = cfg.get("position_embedding_type")
        if pos not in (None, "nope", "rope"):
            raise ModelLoadError(f"{where}: position_embedding_type {pos!r} is not supported (nope or rope)")
        rope = rope_params(cfg) if pos == "rope" else None
        if rope is not None and float(rope["partial_rotary_factor"]) != 1.0:
            raise ModelLoadError(f"{where}: partial rotary embeddings are not supported for granitemoehybrid")
        hidden = config_int(cfg, "hidden_size", where)
        heads = config_int(cfg, "num_attention_heads", where)
        kv = config_int(cfg, "num_key_value_heads", where, heads)
        if heads % kv:
            raise ModelLoadError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        m_heads = config_int(cfg, "mamba_n_heads", where, 128)
        m_inner = config_int(cfg, "mamba_expand", where, 2) * hidden
        m_head_dim = m_inner // m_heads if cfg.get("mamba_d_head") in (None, "auto") else config_int(cfg, "mamba_d_head", where)
        if m_heads * m_head_dim != m_inner:
            raise ModelLoadError(f"{where}: mamba_expand*hidden_size ({m_inner}) must equal mamba_n_heads*mamba_d_head ({m_heads * m_head_dim})")
        eps = float(require(cfg, "rms_norm_eps", where)) if "rms_norm_eps" in cfg else 1e-6
        vocab = config_int(cfg, "vocab_size", where)
        tie = bool(cfg.get("tie_word_embeddings", False))
        mamba = Mamba2Config(
            vocab_size=vocab, hidden_size=hidden, num_layers=kinds.count("mamba"), num_heads=m_heads, head_dim=m_head_dim,
            state_size=config_int(cfg, "mamba_d_state", where, 256), n_groups=config_int(cfg, "mamba_n_groups", where, 1),
            conv_kernel=config_int(cfg, "mamba_d_conv", where, 4), use_bias=bool(cfg.get("mamba_proj_bias", False)),
            use_conv_bias=bool(cfg.get("mamba_conv_bias", True)), norm_eps=eps, gate_norm_eps=eps,
            dt_limit=parse_dt_limit(cfg.get("time_step_limit"), where), tie_word_embeddings=tie, model_type="granitemoehybrid",
        ).checked(where)
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            layer_kinds=kinds,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=config_int(cfg, "head_dim", where, hidden // heads),
            mlp_size=config_int(cfg, "shared_intermediate_size", where, 1024),
            mamba=mamba,
            rms_norm_eps=eps,
            embedding_multiplier=_multiplier(cfg, "embedding_multiplier", where),
            attention_multiplier=_multiplier(cfg, "attention_multiplier", where),
            residual_multiplier=_multiplier(cfg, "residual_multiplier", where),
            logits_scaling=_multiplier(cfg, "logits_scaling", where),
            attention_bias=bool(cfg.get("attention_bias", False)),
            tie_word_embeddings=tie,
            max_position_embeddings=config_int(cfg, "max_position_embeddings", where, 2048),
            rope=rope,
        )


def _multiplier(cfg: dict[str, Any], key: str, where: str) -> float:
    val = float(require(cfg, key, where)) if cfg.get(key) is not None else 1.0  # transformers' default
    if not math.isfinite(val):
        raise ModelLoadError(f"{where}: config field {key!r} has an absurd value {val!r}")
    return val


# ---------------------------------------------------------------------------------------------
# The state: an SSM cache for the Mamba layers and a K/V cache for the attention layers, in step
# ---------------------------------------------------------------------------------------------
class HybridCache:
    """SSMCache (Mamba layers) + KVCache (attention layers) holding the same committed tokens and
    the same scratch tree. Verbs as both (STYLE.md item 8); rollback has the SSM's limits (n == 0,
    n == length, or inside the last commit), so prefix_rollback is False."""

    prefix_rollback = False

    def __init__(self, ssm: SSMCache, kv: KVCache):
        if ssm.capacity != kv.capacity or ssm.max_scratch != kv.max_scratch:
            raise ValueError("the SSM and K/V caches of a hybrid must have the same capacity and scratch limit")
        self.ssm, self.kv = ssm, kv

    @property
    def capacity(self) -> int:
        return self.ssm.capacity

    @property
    def length(self) -> int:
        return self.ssm.length

    @property
    def scratch(self) -> int:
        return self.ssm.scratch

    @property
    def scratch_parents(self) -> list[int]:
        return self.ssm.scratch_parents

    @property
    def draft_pool(self) -> DraftPool:
        return self.ssm.draft_pool

    def room(self) -> int:
        return self.ssm.room()

    def nbytes(self) -> int:
        return self.ssm.nbytes() + self.kv.nbytes()

    def add_nodes(self, parents: Sequence[int]) -> tuple[TreePlan, int, torch.Tensor, torch.Tensor | None]:
        """Place T scratch nodes in both caches: the TreePlan of SSMCache.add_nodes, then
        (start, positions, mask) as KVCache.extend_plan. The SSM side checks the parents first."""
        plan = self.ssm.add_nodes(parents)
        try:
            start, positions, mask = self.kv.extend_plan(parents)
        except BaseException:
            self.clear_scratch()
            raise
        return plan, start, positions, mask

    def commit(self, rows: Sequence[int]) -> None:
        """Replay ``rows`` (a root-to-node chain) into the SSM state and compact their K/V rows."""
        rows = list(rows)
        self.ssm.commit(rows)  # checks the chain before changing anything
        self.kv.commit(rows)

    def clear_scratch(self) -> None:
        self.ssm.clear_scratch()
        self.kv.clear_scratch()

    def rollback(self, length: int) -> None:
        self.clear_scratch()
        self.ssm.rollback(length)  # raises where a recurrent state cannot go
        self.kv.rollback(length)

    def reset(self) -> None:
        self.ssm.reset()
        self.kv.reset()


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class GraniteHybrid(CausalLM):
    family = "granitemoehybrid"

    def __init__(self, cfg: GraniteHybridConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, max_context: int | None = None):
        super().__init__()
        self.cfg = cfg
        self._dtype = dtype
        D, H, K, E, Fw, V = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_size, cfg.vocab_size
        if cfg.rope is None:  # NoPE: no position table to outgrow; default to the trained length
            self.max_context = max_context or cfg.max_position_embeddings
        else:
            limit = context_limit(cfg.rope, cfg.max_position_embeddings)
            self.max_context = min(max_context or limit, limit)
        get = tensor_getter(sd, "Granite-4.0-H")
        emb = get("model.embed_tokens.weight", (V, D))
        self.embed = emb.to(dtype).contiguous()  # (V, D)
        lm = None if cfg.tie_word_embeddings else sd.get("lm_head.weight")
        self.lm_head_t = as_t(emb if lm is None else get("lm_head.weight", (V, D)), dtype)  # (D, V)
        self.norm = get("model.norm.weight", (D,)).to(dtype)
        self.layers: list[dict[str, Any]] = []
        n_kind = {"mamba": 0, "attention": 0}
        for i, kind in enumerate(cfg.layer_kinds):
            p = f"model.layers.{i}."
            L = {
                "kind": kind,
                "slot": n_kind[kind],  # index among the layers of its kind: its place in the SSM or K/V cache
                "ln1": get(p + "input_layernorm.weight", (D,)).to(dtype),
                "ln2": get(p + "post_attention_layernorm.weight", (D,)).to(dtype),
                "w_mlp_in": as_t(get(p + "shared_mlp.input_linear.weight", (2 * Fw, D)), dtype),  # (D, 2F): gate | up
                "w_mlp_out": as_t(get(p + "shared_mlp.output_linear.weight", (D, Fw)), dtype),
            }
            n_kind[kind] += 1
            if kind == "mamba":
                L["mixer"] = Mamba2Mixer(cfg.mamba, get, p + "mamba.", dtype)
            else:
                a = p + "self_attn."
                qkv = [get(a + "q_proj.weight", (H * E, D)), get(a + "k_proj.weight", (K * E, D)), get(a + "v_proj.weight", (K * E, D))]
                L["wqkv"] = as_t(torch.cat(qkv), dtype)  # (D, (H + 2K) E)
                L["wo"] = as_t(get(a + "o_proj.weight", (D, H * E)), dtype)
                L["bqkv"] = torch.cat([get(a + f"{n}_proj.bias") for n in "qkv"]).to(dtype) if cfg.attention_bias else None
                L["bo"] = get(a + "o_proj.bias", (D,)).to(dtype) if cfg.attention_bias else None
            self.layers.append(L)
        self.kv_dims = (n_kind["attention"], K, E)
        self.rope = Rope(E, cfg.rope, self.max_context, dtype, self.embed.device) if cfg.rope is not None else None
        if self.rope is not None and self.device.type != "cpu":
            self.rope.cos, self.rope.sin = self.rope.cos.to(self.device), self.rope.sin.to(self.device)
        self.graphs = cuda_graphs.GraphSet.for_device(self.device) if cuda_graphs.ENABLED else None

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def use_cuda_graphs(self, on: bool = True, emulate: bool = False) -> bool:
        """Replay a fresh verify pass's runs of Mamba layers from CUDA graphs (engine/cuda_graphs.py;
        the attention layers and a hybrid drafter's steps, whose K/V tails grow, stay eager); on
        a CPU only with ``emulate`` (tests). Returns whether graphs are on."""
        self.graphs = (cuda_graphs.GraphSet(self.device, emulate=True, warmup=1) if emulate
                       else cuda_graphs.GraphSet.for_device(self.device)) if on else None
        return self.graphs is not None

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"family": c.model_type, "layers": c.num_layers, "attention_layers": [i for i, k in enumerate(c.layer_kinds) if k == "attention"],
                "hidden": c.hidden_size, "heads": f"{c.num_heads}/{c.num_kv_heads}", "mamba_heads": c.mamba.num_heads,
                "state": c.mamba.state_size, "vocab": self.vocab_size, "dtype": str(self._dtype).replace("torch.", "")}

    def new_cache(self, capacity: int) -> HybridCache:
        A = [L["mixer"].A for L in self.layers if L["kind"] == "mamba"]  # in slot order
        kv = KVCache(*self.kv_dims, capacity, self._dtype)
        if self.device.type != "cpu":
            kv.k, kv.v = kv.k.to(self.device), kv.v.to(self.device)  # the mask buffer stays on the host
        return HybridCache(SSMCache.for_config(self.cfg.mamba, capacity, self._dtype, self.device, torch.stack(A) if A else None), kv)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return mm(hidden, self.lm_head_t) / self.cfg.logits_scaling  # (T, V)

    # verify / extend / prefill / commit / rollback come from CausalLM and HybridCache; this is the forward.
    def _prefill_dense(self, part: list[int], backend: str) -> None:
        """One prefill chunk with the Mamba layers by the dense chunked kernels (CausalLM.prefill
        decides when; their state after the chunk lands in the spare buffers) and the attention
        layers as always (the chain's K/V rows, then compacted)."""
        self._run(part, list(range(-1, len(part) - 1)), want_logits=False, dense=backend)
        self.cache.kv.commit(range(len(part)))
        self.cache.ssm.adopt_spare(len(part))

    def _run(self, tokens: Sequence[int], parents: Sequence[int], want_logits: bool, dense: str | None = None) -> torch.Tensor | None:
        """The forward of T new nodes. ``dense`` (a prefill chain, see ``prefill``): the Mamba
        layers by that backend's dense kernels, into the spare state, storing no activations."""
        c, cache = self.cfg, self.cache
        tree, start, positions, mask = cache.add_nodes(parents)
        try:
            x = embed_rows(self.embed, tokens) * c.embedding_multiplier  # (T, D)
            T = len(tokens)
            dev = self.device
            tree = tree.to(dev)
            plan = None
            if self._dtype == torch.bfloat16:
                # made from the host mask (its loops and nonzero would each sync on a GPU), then moved
                plan = attn_plan(mask, start + T, T, c.num_heads // c.num_kv_heads, native=dev.type == "cpu")
                plan = plan if dev.type == "cpu" else plan_to(plan, dev)
            mask = mask.to(dev) if mask is not None else None
            graphed = self.graphs is not None and tree.fresh and want_logits  # verify passes; prefill chunks stay eager
            for r, (kind, run) in enumerate(runs_of(self.layers)):
                if kind == "mamba":
                    x = self._mamba_run_graphed(r, run, x, tree) if graphed else self._mamba_run(run, x, tree, dense)
                    continue
                for L in run:
                    h = rms_norm(x, L["ln1"], c.rms_norm_eps)
                    q, k, v = self._qkv(L, h, positions)  # tree attention over [committed K/V ; scratch tree]
                    a = L["slot"]
                    y = self._attn_out(L, cached_attention(q, k, v, cache.kv.k[a], cache.kv.v[a], start, mask, c.attention_multiplier, plan))
                    x = self._mlp(L, x + y * c.residual_multiplier)
        except BaseException:
            cache.clear_scratch()  # never leave half-stored activations behind
            raise
        finally:
            if mask is not None:
                cache.kv.release_mask(len(tokens), start + len(tokens))
        return self.logits(rms_norm(x, self.norm, c.rms_norm_eps)) if want_logits else None

    def _mamba_run(self, run: list[dict[str, Any]], x: torch.Tensor, tree: TreePlan, dense: str | None = None) -> torch.Tensor:
        """Consecutive Mamba layers (mixer, then MLP) over the T new nodes: x (T, D) -> (T, D).
        ``dense``: a prefill chain by that backend's dense kernels (Mamba2Mixer.prefill_chain)."""
        c, ssm = self.cfg, self.cache.ssm
        for L in run:
            h = rms_norm(x, L["ln1"], c.rms_norm_eps)
            y = L["mixer"](h, ssm, L["slot"], tree) if dense is None else L["mixer"].prefill_chain(h, ssm, L["slot"], dense)
            x = self._mlp(L, x + y * c.residual_multiplier)
        return x

    def _mamba_run_graphed(self, r: int, run: list[dict[str, Any]], x: torch.Tensor, tree: TreePlan) -> torch.Tensor:
        """``_mamba_run`` from the CUDA graph of run ``r`` at this tree size (a fresh tree: the
        tree is data in static buffers), keyed also by the committed state's buffers, which
        alternate on commit. Returns x in the graph's output buffer, read before the next pass."""
        ssm = self.cache.ssm
        slots = [L["slot"] for L in run]

        def fwd(x: torch.Tensor, anc: torch.Tensor, conv_idx: torch.Tensor, parents: torch.Tensor):
            for s in slots:
                ssm.acts[s] = None  # every run stores a fresh tree's activations
            out = self._mamba_run(run, x, TreePlan(anc, conv_idx, parents, tree.T, tree.chain))
            return out, [ssm.acts[s] for s in slots]

        key = ("mamba-run", r, id(run[0]["mixer"]), tree.T, tree.chain, ssm.ssm.data_ptr(), ssm.conv.data_ptr())
        out, acts = self.graphs.run(key, fwd, {"x": x, "anc": tree.anc, "conv_idx": tree.conv_idx, "parents": tree.parents})
        for s, a in zip(slots, acts):
            ssm.acts[s] = dict(a)  # the graph's buffers: commit copies the accepted rows out
        return out

    # ---- drafting (mamba-drafters §4.1) ---------------------------------------------------------------
    @torch.inference_mode()
    def fork(self, n: int) -> DraftBatch:
        """n draft rows, each a copy of the committed state: the Mamba layers' (conv, ssm), and for
        the attention layers the committed K/V prefix, shared by every row and read in place, plus
        a per-row K/V tail (A, B, K, steps, E) for the tokens each row steps; see
        ssm_cache.DraftBatch."""
        c = self.cache
        A, K, E = self.kv_dims
        tail = c.kv.k.new_empty(()).expand(A, 1, K, c.draft_pool.high.get("k_tail", 8), E)  # shapes only: no copy
        return DraftBatch.of_committed(self, c.draft_pool, n, {"conv": c.ssm.conv[:, None], "ssm": c.ssm.ssm[:, None]}, c.length,
                                       scratch={"k_tail": tail, "v_tail": tail})

    def _step_batch(self, batch: DraftBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One token per row (B,) -> logits (B, V); the rows' states advance in place."""
        c, st = self.cfg, batch.state
        s = batch.steps  # this token's slot in the rows' K/V tails
        kt, vt = batch.grow("k_tail", 3, s + 1), batch.grow("v_tail", 3, s + 1)
        positions = torch.tensor([batch.position])
        x = embed_rows(self.embed, tokens) * c.embedding_multiplier  # (B, D)
        for L in self.layers:
            h = rms_norm(x, L["ln1"], c.rms_norm_eps)
            a = L["slot"]
            if L["kind"] == "mamba":
                y = L["mixer"].step(h, st["conv"][a], st["ssm"][a])
            else:
                q, k, v = self._qkv(L, h, positions)  # (H, B, E), (K, B, E)
                kt[a, :, :, s] = k.transpose(0, 1)
                vt[a, :, :, s] = v.transpose(0, 1)
                y = self._attn_out(L, self._prefix_tail_attention(q, a, batch.start, kt[a, :, :, :s + 1], vt[a, :, :, :s + 1]))
            x = self._mlp(L, x + y * c.residual_multiplier)
        return self.logits(rms_norm(x, self.norm, c.rms_norm_eps))

    # ---- pieces ----------------------------------------------------------------------------------------
    def _qkv(self, L: dict[str, Any], h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q (H, T, E), k, v (K, T, E) of rows h (T, D) at ``positions`` (T,) or one shared (1,)."""
        c = self.cfg
        T, E = h.shape[0], c.head_dim
        qkv = mm(h, L["wqkv"])
        if L["bqkv"] is not None:
            qkv = qkv + L["bqkv"]
        q, k, v = (t.reshape(T, -1, E).transpose(0, 1) for t in qkv.split([c.num_heads * E, c.num_kv_heads * E, c.num_kv_heads * E], -1))
        if self.rope is not None:
            q, k = self.rope.apply(q, positions), self.rope.apply(k, positions)
        return q, k, v

    def _attn_out(self, L: dict[str, Any], o: torch.Tensor) -> torch.Tensor:
        out = mm(o, L["wo"])
        return out if L["bo"] is None else out + L["bo"]

    def _mlp(self, L: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        """x + residual_multiplier · SwiGLU(RMSNorm(x))."""
        c = self.cfg
        g, u = mm(rms_norm(x, L["ln2"], c.rms_norm_eps), L["w_mlp_in"]).chunk(2, dim=-1)
        return x + mm(F.silu(g) * u, L["w_mlp_out"]) * c.residual_multiplier

    def _prefix_tail_attention(self, q: torch.Tensor, slot: int, n: int, k_tail: torch.Tensor, v_tail: torch.Tensor) -> torch.Tensor:
        """Draft rows attending over [committed K/V rows [0, n) of ``slot``, shared ; their own
        tail]: q (H, B, E), tails (B, K, S, E) -> (B, H·E). GQA as common.cached_attention (head
        h = k·G + g). The prefix is read in place, never copied per row."""
        H, B, E = q.shape
        K = k_tail.shape[1]
        kv = self.cache.kv
        qg = q.transpose(0, 1).reshape(B, K, H // K, E)  # (B, K, G, E)
        kc, vc = kv.k[slot, :, :n], kv.v[slot, :, :n]  # (K, n, E)
        scores = torch.cat([torch.einsum("bkge,kne->bkgn", qg, kc), torch.einsum("bkge,bkse->bkgs", qg, k_tail)], dim=-1)
        p = torch.softmax(scores.float() * self.cfg.attention_multiplier, dim=-1).to(vc.dtype)  # (B, K, G, n + S)
        out = torch.einsum("bkgn,kne->bkge", p[..., :n], vc) + torch.einsum("bkgs,bkse->bkge", p[..., n:], v_tail)
        return out.reshape(B, H * E)


def plan_to(plan: AttnPlan, device: torch.device) -> AttnPlan:
    """An attention plan (PyTorch blocks, not the CPU's C kernel) with its tensors on ``device``."""
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return AttnPlan(plan.T, plan.G, plan.nb, move(plan.invalid), plan.nt, move(plan.idx), move(plan.tinvalid))


def runs_of(layers: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The layers as runs of consecutive layers of one kind, in order (a graph records a run)."""
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    for L in layers:
        if runs and runs[-1][0] == L["kind"]:
            runs[-1][1].append(L)
        else:
            runs.append((L["kind"], [L]))
    return runs
