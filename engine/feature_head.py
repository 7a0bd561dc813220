"""A feature-conditioned draft head (EAGLE-style): one decoder layer that reads the target's own
final-norm hidden state beside the next token and predicts the target's next hidden state, whose
logits over a reduced draft vocabulary (rows of the target's tied head) name the draft.

Step t: input fc([embed(x_{t+1}); f_t]) at position t -> one pre-norm Llama layer (RoPE, causal over
the context's earlier inputs) -> RMSNorm -> f^_{t+1}; draft x_{t+2} = argmax f^_{t+1} . W_v (W_v the
target head's rows for the draft vocabulary). Deeper drafts feed f^ back as the feature. The target's
embedding and head stay frozen and are not saved with the head; only fc, the layer, the norms and the
draft vocabulary are (``save``/``load_head``). The draft is verified by the target like any other, so
the head changes speed, never output.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class FeatureHead(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, inter: int, vocab_ids: torch.Tensor,
                 rope_theta: float = 10000.0, eps: float = 1e-5):
        super().__init__()
        D = hidden
        self.cfg = {"hidden": hidden, "heads": heads, "head_dim": head_dim, "inter": inter, "rope_theta": rope_theta, "eps": eps}
        self.H, self.E, self.eps = heads, head_dim, eps
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.ln1 = nn.Parameter(torch.ones(D))
        self.ln2 = nn.Parameter(torch.ones(D))
        self.lnf = nn.Parameter(torch.ones(D))
        self.wqkv = nn.Linear(D, 3 * heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, D, bias=False)
        self.wgu = nn.Linear(D, 2 * inter, bias=False)
        self.wd = nn.Linear(inter, D, bias=False)
        self.register_buffer("vocab_ids", vocab_ids.to(torch.long), persistent=True)
        inv = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.embed: torch.Tensor | None = None  # (V, D) the target's, frozen (attach)
        self.head: torch.Tensor | None = None  # (Vd, D) the target head's draft-vocabulary rows

    # what a loaded drafter is asked for (engine/loading.Loaded: names, JSON rows, the status line)
    family = "feature_head"
    compute_dtype = torch.float32  # drafts run fp32 (products in Q8_0 on a CPU: engine/drafters/feature.py)

    @property
    def vocab_size(self) -> int:
        return int(self.vocab_ids.numel())

    def describe(self) -> dict:
        c = self.cfg
        return {"family": "feature head", "layers": 1, "hidden": c["hidden"], "heads": f"{c['heads']}/{c['heads']}",
                "vocab": self.vocab_size, "dtype": "float32"}

    def attach(self, embed: torch.Tensor, lm_head: torch.Tensor) -> "FeatureHead":
        """The target's embedding (V, D) and head (V, D) rows; kept as plain tensors (not trained)."""
        self.embed = embed.detach()
        self.head = lm_head.detach().index_select(0, self.vocab_ids).contiguous()
        return self

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w.to(x.dtype)

    def _rope(self, t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        ang = pos.to(torch.float32)[..., None] * self.inv_freq  # (..., T, E/2)
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(t.dtype), torch.cat([ang.sin(), ang.sin()], -1).to(t.dtype)
        h = t.shape[-1] // 2
        rot = torch.cat([-t[..., h:], t[..., :h]], -1)
        return t * cos + rot * sin

    def inputs(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        e = self.embed.index_select(0, tokens.reshape(-1)).view(*tokens.shape, -1).to(feats.dtype)
        return self.fc(torch.cat([e, feats], -1))

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys (rotated to ``pos``) and values of rows x (B, T, D), each (B, H, T, E)."""
        B, T, _ = x.shape
        qkv = self.wqkv(self._rms(x, self.ln1)).view(B, T, 3, self.H, self.E).permute(2, 0, 3, 1, 4)
        return self._rope(qkv[0], pos), self._rope(qkv[1], pos), qkv[2]

    def _finish(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The rest of the layer from the attention's output a (B, H, T, E): f^ (B, T, D)."""
        B, T, _ = x.shape
        h = x + self.wo(a.transpose(1, 2).reshape(B, T, self.H * self.E))
        g, u = self.wgu(self._rms(h, self.ln2)).chunk(2, -1)
        h = h + self.wd(F.silu(g) * u)
        return self._rms(h, self.lnf)

    def layer(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None,
              past: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, T, D) at positions pos (B, T) or (T,); past (k, v) (B, H, P, E) earlier rows.
        mask (T, P + T) bool (True: attend), default causal. Returns f^ (B, T, D) and this call's (k, v)."""
        q, k, v = self._qkv(x, pos)
        if past is None and mask is None:
            return self._finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True)), (k, v)
        kk, vv = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if mask is None:
            T, P = x.shape[1], kk.shape[2] - x.shape[1]
            mask = torch.ones(T, P + T, dtype=torch.bool).tril(P)
        return self._finish(x, F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)), (k, v)

    def layer_unrolled(self, x: torch.Tensor, pos: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Training pass u = len(keys) of a draft chain (HASS-style training-time test): row p is the
        depth-(u+1) draft node at position p, its input fed the previous pass's predicted feature.
        As when drafting, it reads the true rows j <= p - u (pass 0's keys), the chain's earlier
        nodes (pass i's key at p - u + i, i = 1..u-1) and itself. x (B, T, D); keys/values of the
        passes before, each (B, H, T, E). Returns f^ (B, T, D) and this pass's (k, v)."""
        T = x.shape[1]
        u = len(keys)
        q, k, v = self._qkv(x, pos)
        mask = torch.zeros(T, (u + 1) * T, dtype=torch.bool, device=x.device)
        mask[:, :T] = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-u)
        rows = torch.arange(T, device=x.device)
        for i in range(1, u + 1):
            src = rows - u + i
            ok = src >= 0
            mask[rows[ok], i * T + src[ok]] = True
        a = F.scaled_dot_product_attention(q, torch.cat(keys + [k], 2), torch.cat(values + [v], 2), attn_mask=mask)
        return self._finish(x, a), (k, v)

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        return f @ self.head.to(f.dtype).t()

    # ---- files --------------------------------------------------------------------------------
    def save(self, out: Path, meta: dict | None = None) -> None:
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in self.state_dict().items() if k != "vocab_ids"}
        sd["vocab_ids"] = self.vocab_ids.to(torch.int32).cpu().contiguous()
        save_file(sd, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps({"model_type": "specchat_feature_head", **self.cfg, **(meta or {})}, indent=1) + "\n")


def load_head(path: Path, dtype: torch.dtype = torch.float32) -> FeatureHead:
    from safetensors.torch import load_file

    cfg = json.loads((Path(path) / "config.json").read_text())
    for k in ("hidden", "heads", "head_dim", "inter"):
        if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or not 0 < cfg[k] <= 65536:
            raise ValueError(f"config.json field {k!r} is {cfg.get(k)!r}")
    sd = load_file(str(Path(path) / "model.safetensors"))
    m = FeatureHead(cfg["hidden"], cfg["heads"], cfg["head_dim"], cfg["inter"], sd["vocab_ids"].long(), cfg["rope_theta"], cfg["eps"])
    sd["vocab_ids"] = sd["vocab_ids"].long()
    m.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()})
    return m.to(dtype).eval()


MODEL_TYPE = "specchat_feature_head"


def feature_head_dir(ref: str, registry=None) -> Path | None:
    """REF's directory where it holds a feature head (config.json's model_type says so), else None."""
    from .errors import ModelLoadError
    from .loading import resolve

    try:
        _, p = resolve(ref, registry)
    except ModelLoadError:
        return None
    cfg = Path(p) / "config.json"
    if not Path(p).is_dir() or not cfg.is_file():
        return None
    try:
        return Path(p) if json.loads(cfg.read_text()).get("model_type") == MODEL_TYPE else None
    except (OSError, ValueError, AttributeError):
        return None


def load_feature_head(path: Path, target):
    """A feature head as an engine.loading.Loaded beside ``target`` (a Loaded): it shares the
    target's tokenizer, and must read hidden rows as wide as the target's and name its tokens."""
    from .errors import ModelLoadError
    from .loading import Loaded

    try:
        head = load_head(path)
    except Exception as e:  # noqa: BLE001 (safetensors' own error types, shapes, missing fields: one line)
        raise ModelLoadError(f"{path}: not a usable feature head ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    embed = getattr(target.model, "embed", None)
    D = int(embed.shape[1]) if isinstance(embed, torch.Tensor) else None
    if D != head.cfg["hidden"]:
        raise ModelLoadError(f"feature head {path.name} reads {head.cfg['hidden']}-wide hidden rows; "
                             f"the target {target.name} has {D if D else 'no Transformer'} hidden rows")
    if int(head.vocab_ids.max()) >= target.model.vocab_size or int(head.vocab_ids.min()) < 0:
        raise ModelLoadError(f"feature head {path.name} drafts token ids outside {target.name}'s vocabulary")
    params = sum(p.numel() for p in head.parameters())
    return Loaded(model=head, tokenizer=target.tokenizer, name=path.name, path=path, fmt="feature-head",
                  config=dict(head.cfg), params=params)


def as_llama(head: FeatureHead, capacity: int, q8: bool = False):
    """The head's layer as a one-layer engine Llama (engine/models/llama.py) over its draft
    vocabulary: its embedding is the head's rows (tied: the logits), its final norm the head's, so
    ``forward_x`` runs the layer in one C call (llama_rows.c) with the engine's tree KV cache.
    ``q8``: the projections and the head in Q8_0 (linear.c's records). Same maths as ``layer``."""
    from .models.llama import Llama, LlamaConfig

    c = head.cfg
    H, E, D = c["heads"], c["head_dim"], c["hidden"]
    cfg = LlamaConfig.from_hf({"model_type": "llama", "vocab_size": int(head.head.shape[0]), "hidden_size": D,
                               "intermediate_size": c["inter"], "num_hidden_layers": 1, "num_attention_heads": H,
                               "num_key_value_heads": H, "head_dim": E, "rms_norm_eps": c["eps"],
                               "rope_theta": c["rope_theta"], "max_position_embeddings": capacity,
                               "tie_word_embeddings": True})
    f32 = lambda t: t.detach().to(torch.float32).contiguous()  # noqa: E731
    q, k, v = head.wqkv.weight.detach().chunk(3, 0)
    g, u = head.wgu.weight.detach().chunk(2, 0)
    p = "model.layers.0."
    sd = {"model.embed_tokens.weight": f32(head.head), "model.norm.weight": f32(head.lnf),
          p + "input_layernorm.weight": f32(head.ln1), p + "post_attention_layernorm.weight": f32(head.ln2),
          p + "self_attn.q_proj.weight": f32(q), p + "self_attn.k_proj.weight": f32(k), p + "self_attn.v_proj.weight": f32(v),
          p + "self_attn.o_proj.weight": f32(head.wo.weight), p + "mlp.gate_proj.weight": f32(g),
          p + "mlp.up_proj.weight": f32(u), p + "mlp.down_proj.weight": f32(head.wd.weight)}
    m = Llama(cfg, sd, torch.float32, max_context=capacity)
    m.use_bf16_kv()  # its keys/values in bf16 (where the C pass takes them): a depth reads half the bytes
    if q8:
        L = m.layers[0]
        for key in ("wqkv", "wo", "wgu", "wd"):
            L[key] = L[key].to_q8_0()
        m.lm_head_t = m.lm_head_t.to_q8_0()
        m.__dict__.pop("_native_tab", None)
    m.allocate(capacity)
    return m
