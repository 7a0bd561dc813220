"""REF -> model + tokenizer. REF is a models.toml name, a local HF-format directory, a .gguf file,
or a Hub id already in the local Hugging Face cache (downloads are explicit: `specchat download`).

Never executes remote code: configs are read as JSON, weights as safetensors / GGUF, and pickle
checkpoints only through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ModelLoadError
from .models.base import CausalLM
from .registry import Registry, load_registry

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _families() -> dict[str, tuple[Any, Any]]:
    from .models import gpt_neox, granite_hybrid, llama, mamba, mamba2

    fam: dict[str, tuple[Any, Any]] = {}
    for mod, cfg_cls, model_cls in ((llama, llama.LlamaConfig, llama.Llama), (gpt_neox, gpt_neox.GPTNeoXConfig, gpt_neox.GPTNeoX),
                                    (mamba, mamba.MambaConfig, mamba.Mamba), (mamba2, mamba2.Mamba2Config, mamba2.Mamba2),
                                    (granite_hybrid, granite_hybrid.GraniteHybridConfig, granite_hybrid.GraniteHybrid)):
        for mt in mod.MODEL_TYPES:
            fam[mt] = (cfg_cls, model_cls)
    return fam


@dataclass
class Loaded:
    model: CausalLM
    tokenizer: Any  # engine.tokenizer.Tokenizer | None
    name: str
    path: Path
    fmt: str  # "hf" | "gguf"
    config: dict[str, Any] = field(default_factory=dict)
    quant: str | None = None

    @property
    def description(self) -> str:
        q = f" {self.quant}" if self.quant else ""
        return f"{self.name} ({self.fmt}{q}, {str(self.model.dtype).replace('torch.', '')})"


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {None: torch.float32, "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ModelLoadError(f"unknown dtype {name!r} (fp32 or bf16)")
    return table[name]


def resolve(ref: str, registry: Registry | None = None) -> tuple[str, Path]:
    """Turn REF into (display name, local path). Raises ModelLoadError with the next step to take."""
    if not ref or not str(ref).strip():
        raise ModelLoadError("empty model reference")
    ref = str(ref)
    reg = registry if registry is not None else load_registry()
    entry = reg.get(ref)
    if entry is not None:
        base = reg.path.parent if reg.path else None
        p = entry.local_path(base)
        if p is not None:
            return entry.name, p
        if entry.hub_id:
            cached = _hub_cached(entry.hub_id, entry.revision)
            if cached is not None:
                return entry.name, cached
            raise ModelLoadError(f"model {ref!r} ({entry.hub_id}) is not downloaded yet: run `specchat download {ref}`")
        raise ModelLoadError(f"model {ref!r}: its local file {entry.local!r} is missing")
    p = Path(os.path.expanduser(ref))
    if p.exists():
        return p.name, p
    if HUB_ID.match(ref) and not ref.startswith((".", "/")):
        cached = _hub_cached(ref, None)
        if cached is not None:
            return ref, cached
        raise ModelLoadError(f"{ref!r} is not a local path, not in models.toml, and not in the Hugging Face cache: run `specchat download {ref}`")
    raise ModelLoadError(f"{ref!r}: no such file or directory, and not a models.toml name")


def _hub_cached(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot of a Hub id (our downloader's or huggingface_hub's layout), no network."""
    from .hub import cached_snapshot

    return cached_snapshot(repo_id, revision)


DEFAULT_CONTEXT = 8192  # KV rows are allocated up front: a 128k-context model would take GBs


def load(ref: str, *, dtype: str | torch.dtype | None = None, registry: Registry | None = None,
         max_context: int | None = None, need_tokenizer: bool = False) -> Loaded:
    """Load REF. The context is the model's own limit, capped at DEFAULT_CONTEXT unless
    ``max_context`` asks for more (or less)."""
    max_context = max_context or DEFAULT_CONTEXT
    name, path = resolve(ref, registry)
    dt = parse_dtype(dtype)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _load_gguf(name, path, dt, max_context)
        raise ModelLoadError(f"{path}: not a model (expected a .gguf file or an HF-format directory)")
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").exists() and len(ggufs) == 1:
        return _load_gguf(name, ggufs[0], dt, max_context)
    loaded = _load_hf_dir(name, path, dt, max_context)
    if need_tokenizer and loaded.tokenizer is None:
        raise ModelLoadError(f"{path}: no tokenizer (tokenizer.json) found; pass --prompt-ids to decode from token ids")
    return loaded


def read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{path}: not a model directory (no config.json)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: invalid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path}: expected a JSON object")
    if cfg.get("auto_map") and cfg.get("model_type") not in _families():
        raise ModelLoadError(f"{cfg_path}: this model needs its own remote code (auto_map); specchat never runs remote code")
    return cfg


def build(cfg: dict[str, Any], sd: dict[str, torch.Tensor], dtype: torch.dtype, max_context: int | None, where: str) -> CausalLM:
    mt = cfg.get("model_type")
    if mt is None and "d_model" in cfg and isinstance(cfg.get("ssm_cfg"), dict):
        return _build_mamba_ssm(cfg, sd, dtype, max_context, where)
    fams = _families()
    if mt not in fams:
        raise ModelLoadError(f"{where}: unknown architecture model_type={mt!r} (supported: {', '.join(sorted(fams))})")
    cfg_cls, model_cls = fams[mt]
    return model_cls(cfg_cls.from_hf(cfg, where), sd, dtype=dtype, max_context=max_context)


def _build_mamba_ssm(cfg: dict[str, Any], sd: dict[str, torch.Tensor], dtype: torch.dtype, max_context: int | None, where: str) -> CausalLM:
    """Original state-spaces/mamba* checkpoints: config.json with d_model/n_layer/ssm_cfg, no model_type."""
    layer = cfg["ssm_cfg"].get("layer", "Mamba1")
    if layer == "Mamba2":
        from .models import mamba2

        return mamba2.Mamba2(mamba2.Mamba2Config.from_mamba_ssm(cfg, where), mamba2.remap_mamba_ssm_state_dict(sd),
                             dtype=dtype, max_context=max_context)
    raise ModelLoadError(f"{where}: original-format {layer} checkpoints are not supported; use the HF-format "
                         "(state-spaces/mamba-*-hf) port")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if files:
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                sd.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:
                raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None
        return sd
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        sd = {}
        for f in bins:
            try:
                obj = torch.load(str(f), map_location="cpu", weights_only=True)  # never unpickle code
            except Exception as e:
                raise ModelLoadError(f"{f}: cannot load safely with weights_only=True ({str(e).splitlines()[0][:160]})") from None
            sd.update(obj.get("state_dict", obj) if isinstance(obj, dict) else {})
        return sd
    raise ModelLoadError(f"{path}: no weights (*.safetensors or pytorch_model.bin)")


def _load_hf_dir(name: str, path: Path, dtype: torch.dtype, max_context: int | None) -> Loaded:
    cfg = read_config(path)
    sd = read_state_dict(path)
    model = build(cfg, sd, dtype, max_context, str(path))
    tok = None
    if (path / "tokenizer.json").exists():
        from .tokenizer import Tokenizer

        try:
            tok = Tokenizer.from_hf_dir(path)
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(f"{path}/tokenizer.json: cannot load tokenizer ({str(e).splitlines()[0][:160]})") from None
        _check_tokenizer(tok, model, path)
    if (path / "draft_vocab.json").exists():
        model.draft_vocab = _read_draft_vocab(path / "draft_vocab.json", model.vocab_size)
    return Loaded(model, tok, name, path, "hf", cfg)


def _read_draft_vocab(path: Path, vocab_size: int) -> torch.Tensor:
    """A drafter's draft vocabulary ({"token_ids": [...]}, written by `specchat distill train`):
    the only tokens it proposes, so its output layer can shrink to them."""
    try:
        ids = json.loads(path.read_text())["token_ids"]
        t = torch.tensor(ids, dtype=torch.long)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path}: not a draft vocabulary ({str(e).splitlines()[0][:120]})") from None
    if t.dim() != 1 or t.numel() == 0 or int(t.min()) < 0 or int(t.max()) >= vocab_size or t.unique().numel() != t.numel():
        raise ModelLoadError(f"{path}: token ids must be distinct and within the model's vocabulary (0..{vocab_size - 1})")
    return t


def _load_gguf(name: str, path: Path, dtype: torch.dtype, max_context: int | None) -> Loaded:
    from .gguf import load_gguf

    ck = load_gguf(path)
    model = build(ck.config, ck.state_dict, dtype, max_context, str(path))
    _check_tokenizer(ck.tokenizer, model, path)
    return Loaded(model, ck.tokenizer, name, path, "gguf", ck.config, getattr(ck, "quant", None))


def _check_tokenizer(tok: Any, model: CausalLM, path: Path) -> None:
    if tok is not None and tok.vocab_size > model.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's embedding has only {model.vocab_size} rows (mismatched tokenizer)")
