"""REF -> model + tokenizer. REF is a models.toml name, a local HF-format directory, a .gguf file,
or a Hub id already in the local Hugging Face cache (downloads are explicit: `specchat download`).

Never executes remote code: configs are read as JSON, weights as safetensors / GGUF, and pickle
checkpoints only through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ModelLoadError
from .models.base import CausalLM
from .registry import Registry, load_registry, read_small

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
    kept_quantized: int = 0  # projections multiplied from their GGUF blocks (engine/models/quant.py)
    act8: bool = False  # the q8 compute type: those products take 8-bit activations (quant_a8.c)
    params: int = 0  # parameters in the checkpoint (a tied head counted once)
    note: str | None = None  # what the load did other than asked (--dtype q8 without blocks to multiply)

    @property
    def compute(self) -> str:
        """The compute type: "q8" (fp32 with 8-bit activations in the GGUF blocks' products),
        else the model's dtype ("float32", "bfloat16")."""
        return "q8" if self.act8 else str(self.model.compute_dtype).replace("torch.", "")

    @property
    def compute_flag(self) -> str:
        """The compute type in --dtype's words ("q8", "bf16", "fp32"): what JSON results record,
        so a result's dtype reads as the flag that reproduces it."""
        return dtype_flag(self.compute)

    @property
    def description(self) -> str:
        q = f" {self.quant}" if self.quant else ""
        kept = ", blocks kept" if self.kept_quantized else ""
        return f"{self.name} ({self.fmt}{q}, {self.compute}{kept})"


def dtype_flag(compute: str | torch.dtype) -> str:
    """A compute type ("bfloat16", torch.float32, "q8", ...) in --dtype's words (bf16, fp32, q8)."""
    name = str(compute).replace("torch.", "")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name)


def parse_dtype(name: str | torch.dtype | None, model_type: str | None = None, hf_config: dict | None = None) -> torch.dtype:
    """None is fp32 (the library default); "auto" is the faster of fp32 and bf16 on this machine
    for a model of ``model_type`` (engine/dtype_probe.py), the CLI's default. "q8" is fp32 here
    (its 8-bit activations are a property of the GGUF products: ``load``)."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        from .dtype_probe import auto_dtype

        name = auto_dtype(model_type=model_type, hf_config=hf_config)
    table = {None: torch.float32, "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "q8": torch.float32}
    if name not in table:
        raise ModelLoadError(f"unknown dtype {name!r} (auto, fp32, bf16 or q8)")
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
        looked = ""
        if not entry.local.startswith("pkg:") and not Path(os.path.expanduser(entry.local)).is_absolute() and base is not None:
            looked = f" (looked for {base / entry.local}: a relative path is read from the models file's directory)"
        raise ModelLoadError(f"model {ref!r}: its local file {entry.local!r} is missing{looked}")
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
         max_context: int | None = None, need_tokenizer: bool = False, device: str | torch.device | None = None) -> Loaded:
    """Load REF. The context is the model's own limit, capped at DEFAULT_CONTEXT unless
    ``max_context`` asks for more (or less). ``device`` (default: the CPU) builds the model there
    from the dequantised weights (no kept GGUF blocks, no q8 compute type: those are CPU kernels);
    with no ``dtype`` a GPU model is bf16. Used by `specchat distill data --device cuda`."""
    if max_context is not None and (not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < 0):
        raise ModelLoadError(f"max_context (--max-context) must be a number of tokens >= 0 (0: the default), got {max_context!r}")
    max_context = max_context or DEFAULT_CONTEXT
    name, path = resolve(ref, registry)
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cpu":
        dev = None
    if dev is not None and dtype in (None, "auto", "q8"):
        dtype = "bf16"
    dt = parse_dtype(dtype) if dtype not in ("auto", "q8") else dtype  # "auto" waits for the model's type
    loaded = _load_path(name, path, dt, max_context, dev, need_tokenizer)
    if dtype == "q8" and not loaded.act8:  # (it ran fp32 silently: only the JSON's dtype said so)
        what = "an HF-format checkpoint" if loaded.fmt == "hf" else "a GGUF without quantised blocks this CPU multiplies"
        loaded.note = f"--dtype q8 multiplies a GGUF's quantised blocks; {name} is {what}: it runs in fp32"
    return loaded


def _load_path(name: str, path: Path, dt: torch.dtype | str, max_context: int, dev: torch.device | None,
               need_tokenizer: bool) -> Loaded:
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return _ready(_load_gguf(name, path, dt, max_context, dev), dev)
        raise ModelLoadError(f"{path}: not a model (expected a .gguf file or an HF-format directory)")
    if path.is_dir():
        try:  # without read or search permission, the checks below would raise from scandir / stat
            os.scandir(path).close()
            (path / "config.json").exists()
        except OSError as e:
            raise ModelLoadError(f"cannot read directory ({e.strerror or e})", path=path) from None
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").exists() and len(ggufs) == 1:
        return _ready(_load_gguf(name, ggufs[0], dt, max_context, dev), dev)
    if not (path / "config.json").exists() and ggufs:
        if all(re.search(r"-\d{5}-of-\d{5}\.gguf$", g.name, re.I) for g in ggufs):  # one split model: its error
            return _ready(_load_gguf(name, ggufs[0], dt, max_context, dev), dev)
        shown = ", ".join(g.name for g in ggufs[:4]) + (", ..." if len(ggufs) > 4 else "")
        raise ModelLoadError(f"{path}: holds {len(ggufs)} .gguf files ({shown}) and no config.json: pass the .gguf file to load")
    loaded = _ready(_load_hf_dir(name, path, dt, max_context, dev), dev)
    if need_tokenizer and loaded.tokenizer is None:
        raise ModelLoadError(f"{path}: no tokenizer (tokenizer.json) found; pass --prompt-ids to decode from token ids")
    return loaded


def _ready(loaded: Loaded, device: torch.device | None) -> Loaded:
    """The loaded model, its loader's heap trimmed (``_trimmed``) and, on CPU (``device`` None), the
    row count of its small packed products decided (engine/models/common.pad_rows: measured once
    per machine, here rather than inside the first reply's first step)."""
    model = loaded.model
    # (the CPU bf16 compute type has no packed products: nothing to decide)
    if device is None and model.dtype in (torch.float32, torch.bfloat16) and model.compute_dtype == model.dtype:
        from .models.common import pad_rows

        pad_rows(model.dtype)
    return _trimmed(loaded)


def _trimmed(loaded: Loaded) -> Loaded:
    """Give the heap the loader freed back to the system: the fp32 state dict, dequantised GGUF
    tensors and replaced layouts leave ~0.6 GB in glibc's arenas otherwise (SmolLM2 + drafter:
    RSS 1579 -> 1005 MB measured). glibc only; anything else is left alone."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return loaded


def read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{path}: not a model directory (no config.json)")
    return read_config_file(cfg_path)


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB: a bound for a FIFO or /dev/zero, not a size limit


def _json_float_sentinel(obj: dict[str, Any]) -> Any:
    """transformers 5.x writes a non-finite float as {"__float__": "Infinity"} (Mamba-2's and
    Granite-4.0-H's time_step_limit): the float itself, as older files' JSON literal reads, so the
    config is what transformers' own strict config classes accept (bench --tree-scaling builds one)."""
    if len(obj) == 1 and "__float__" in obj and isinstance(obj["__float__"], str):
        try:
            return float(obj["__float__"])
        except ValueError:
            return obj  # not a float after all: the family's own check says so
    return obj


def read_config_file(cfg_path: Path) -> dict[str, Any]:
    """config.json at ``cfg_path`` (``read_config``'s checks; ``bench --tree-scaling`` takes the file itself)."""
    try:
        cfg = json.loads(read_small(cfg_path, "config file", MAX_CONFIG_BYTES, ModelLoadError).decode("utf-8"),
                         object_hook=_json_float_sentinel)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_path}: invalid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_path}: expected a JSON object")
    if cfg.get("model_type") is not None and not isinstance(cfg["model_type"], str):
        raise ModelLoadError(f"{cfg_path}: model_type must be a string, not {cfg['model_type']!r}")
    if cfg.get("auto_map") and cfg.get("model_type") not in _families():
        raise ModelLoadError(f"{cfg_path}: this model needs its own remote code (auto_map); specchat never runs remote code")
    _check_config_values(cfg, cfg_path)
    return cfg


# Fields several families share: when present (and not null) they must be sane, whatever the family
# does with them later (a string or a negative size would otherwise fail deep inside a model).
_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "d_model", "n_layer")
_CONTEXT_FIELDS = ("max_position_embeddings", "sliding_window")
_EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")


def _check_config_values(cfg: dict[str, Any], cfg_path: Path) -> None:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for key in _SIZE_FIELDS:
        v = cfg.get(key)
        if v is not None and not (is_int(v) and 0 < v <= 10_000_000):
            raise ModelLoadError(f"{cfg_path}: config field {key!r} has an absurd value {v!r} (expected a positive integer)")
    for key in _CONTEXT_FIELDS:
        v = cfg.get(key)
        if v is not None and not (is_int(v) and v > 0):
            raise ModelLoadError(f"{cfg_path}: config field {key!r} has an absurd value {v!r} (expected a positive integer)")
    for key in _EPS_FIELDS:
        v = cfg.get(key)
        if v is not None and not (is_num(v) and 0 <= v < 1):
            raise ModelLoadError(f"{cfg_path}: config field {key!r} has an absurd value {v!r} (expected a small non-negative number)")
    v = cfg.get("rope_theta")
    if v is not None and not (is_num(v) and v > 0):
        raise ModelLoadError(f"{cfg_path}: config field 'rope_theta' has an absurd value {v!r} (expected a positive number)")
    for key in ("rope_scaling", "rope_parameters"):
        v = cfg.get(key)
        if v is not None and not isinstance(v, dict):
            raise ModelLoadError(f"{cfg_path}: config field {key!r} must be an object, not {v!r}")
        factor = (v or {}).get("factor")
        if factor is not None and not (is_num(factor) and factor > 0):
            raise ModelLoadError(f"{cfg_path}: {key}.factor has an absurd value {factor!r} (expected a positive number)")
    for key in ("partial_rotary_factor", "rotary_pct"):
        v = cfg.get(key)
        if v is not None and not (is_num(v) and 0 < v <= 1):
            raise ModelLoadError(f"{cfg_path}: config field {key!r} has an absurd value {v!r} (expected 0 < x <= 1)")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    kv = cfg.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise ModelLoadError(f"{cfg_path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if heads and hidden and cfg.get("head_dim") is None and hidden % heads:
        raise ModelLoadError(f"{cfg_path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no head_dim is given)")


def build(cfg: dict[str, Any], sd: dict[str, torch.Tensor], dtype: torch.dtype, max_context: int | None, where: str) -> CausalLM:
    """The model of a config.json dict and its state dict. Every failure is a one-line
    ``ModelLoadError`` naming ``where``: the families raise their own for what they check, and a
    field of the wrong type or a tensor that does not fit is caught here."""
    try:
        return _build(cfg, sd, dtype, max_context, where)
    except ModelLoadError as e:
        if where in str(e):
            raise
        raise ModelLoadError(e.problem, path=where) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ArithmeticError, RuntimeError) as e:
        # a config field of the wrong type or a tensor of the wrong shape that the family did not check
        msg = (str(e).strip().splitlines() or [""])[0][:200]
        raise ModelLoadError(f"config and weights do not make a model ({type(e).__name__}: {msg})", path=where) from None


def _build(cfg: dict[str, Any], sd: dict[str, torch.Tensor], dtype: torch.dtype, max_context: int | None, where: str) -> CausalLM:
    mt = cfg.get("model_type")
    if mt is None and "d_model" in cfg and isinstance(cfg.get("ssm_cfg"), dict):
        return _build_mamba_ssm(cfg, sd, dtype, max_context, where)
    fams = _families()
    if not isinstance(mt, str) or mt not in fams:
        raise ModelLoadError(f"{where}: unknown architecture model_type={mt!r} (supported: {', '.join(sorted(fams))})")
    cfg_cls, model_cls = fams[mt]
    model_cfg = cfg_cls.from_hf(cfg, where)
    _check_shapes(model_cls.family, model_cfg, sd)
    if (dtype == torch.bfloat16 and hasattr(model_cls, "bf16_fits") and all(t.device.type == "cpu" for t in sd.values())
            and model_cls.bf16_fits(model_cfg)):
        # the CPU bf16 compute type: bf16 products inside the fp32 C pass (Llama.keep_bf16)
        from .models.common import building_bf16_records

        with building_bf16_records():
            model = model_cls(model_cfg, sd, dtype=torch.float32, max_context=max_context)
        if model.keep_bf16():
            return model
    return model_cls(model_cfg, sd, dtype=dtype, max_context=max_context)


def _check_shapes(family: str, c: Any, sd: dict[str, torch.Tensor]) -> None:
    """Every tensor present must have the shape the config implies (the families check only some;
    a wrong-shaped one would fail mid-generation, or not at all), the weights no more layers than
    the config names, and no weight a NaN or an infinity (each made a model that loaded and
    decoded garbage). Missing ones are the family's to name. GGUF blocks kept for the C kernels
    (shape-only placeholders here) are not read."""
    want: dict[str, tuple[int, ...]] = {}
    if family == "llama":
        D, F, H, K, E, V = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size
        want = {"model.embed_tokens.weight": (V, D), "lm_head.weight": (V, D), "model.norm.weight": (D,)}
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            for name, shape in (("input_layernorm.weight", (D,)), ("post_attention_layernorm.weight", (D,)),
                                ("self_attn.q_proj.weight", (H * E, D)), ("self_attn.k_proj.weight", (K * E, D)),
                                ("self_attn.v_proj.weight", (K * E, D)), ("self_attn.o_proj.weight", (D, H * E)),
                                ("self_attn.q_proj.bias", (H * E,)), ("self_attn.k_proj.bias", (K * E,)),
                                ("self_attn.v_proj.bias", (K * E,)), ("self_attn.o_proj.bias", (D,)),
                                ("mlp.gate_proj.weight", (F, D)), ("mlp.up_proj.weight", (F, D)), ("mlp.down_proj.weight", (D, F)),
                                ("mlp.gate_proj.bias", (F,)), ("mlp.up_proj.bias", (F,)), ("mlp.down_proj.bias", (D,))):
                want[p + name] = shape
    elif family == "gpt_neox":
        D, F, V = c.hidden_size, c.intermediate_size, c.vocab_size
        want = {"gpt_neox.embed_in.weight": (V, D), "embed_out.weight": (V, D), "lm_head.weight": (V, D),
                "gpt_neox.final_layer_norm.weight": (D,), "gpt_neox.final_layer_norm.bias": (D,)}
        for i in range(c.num_layers):
            p = f"gpt_neox.layers.{i}."
            for name, shape in (("input_layernorm.weight", (D,)), ("input_layernorm.bias", (D,)),
                                ("post_attention_layernorm.weight", (D,)), ("post_attention_layernorm.bias", (D,)),
                                ("attention.query_key_value.weight", (3 * D, D)), ("attention.query_key_value.bias", (3 * D,)),
                                ("attention.dense.weight", (D, D)), ("attention.dense.bias", (D,)),
                                ("mlp.dense_h_to_4h.weight", (F, D)), ("mlp.dense_h_to_4h.bias", (F,)),
                                ("mlp.dense_4h_to_h.weight", (D, F)), ("mlp.dense_4h_to_h.bias", (D,))):
                want[p + name] = shape
    elif family == "mamba":
        D, I = c.hidden_size, c.intermediate_size
        want = {"backbone.norm_f.weight": (D,)}
        for i in range(c.num_layers):
            p = f"backbone.layers.{i}."
            want.update({p + "norm.weight": (D,), p + "mixer.conv1d.bias": (I,), p + "mixer.dt_proj.bias": (I,),
                         p + "mixer.in_proj.bias": (2 * I,), p + "mixer.out_proj.bias": (D,)})
    for name, shape in want.items():
        t = sd.get(name)
        if t is not None and tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name} has shape {tuple(t.shape)}, config implies {shape}")
    prefix = _LAYER_PREFIX.get(family)
    if prefix is not None:  # a config with fewer layers than the weights would run a truncated model
        indices = (k[len(prefix):].split(".", 1)[0] for k in sd if k.startswith(prefix))
        have = 1 + max((int(i) for i in indices if i.isdigit()), default=-1)
        if have > c.num_layers:
            raise ModelLoadError(f"the weights hold {have} layers but the config says {c.num_layers} "
                                 "(num_hidden_layers): config.json does not belong to these weights")
    for name, t in sd.items():  # (aminmax carries a NaN through: one pass, ~18x faster than isfinite().all())
        if t.is_floating_point() and t.device.type != "meta" and t.numel() and not all(
                bool(torch.isfinite(v)) for v in torch.aminmax(t)):
            raise ModelLoadError(f"tensor {name} holds NaN or infinite values: the checkpoint is damaged")


# where each family's per-layer tensors are named (the layer index follows)
_LAYER_PREFIX = {"llama": "model.layers.", "gpt_neox": "gpt_neox.layers.", "mamba": "backbone.layers.",
                 "mamba2": "backbone.layers."}


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
            _check_readable(f)
            try:
                sd.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:
                raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({str(e).splitlines()[0]})") from None
        return sd
    bins = sorted(path.glob("pytorch_model*.bin"))
    if bins:
        sd = {}
        for f in bins:
            _check_readable(f)
            try:
                obj = torch.load(str(f), map_location="cpu", weights_only=True)  # never unpickle code
            except Exception as e:
                raise ModelLoadError(_pickle_refusal(e), path=f) from None
            if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
                obj = obj["state_dict"]
            if not isinstance(obj, dict):
                raise ModelLoadError(f"holds a {type(obj).__name__}, not a state dict of tensors", path=f)
            for k, v in obj.items():
                if not isinstance(k, str) or not isinstance(v, torch.Tensor):
                    raise ModelLoadError(f"not a state dict of tensors: entry {str(k)[:80]!r} is a {type(v).__name__} "
                                         "(refused: only tensors are loaded from pickle checkpoints)", path=f)
            sd.update(obj)
        return sd
    raise ModelLoadError(f"{path}: no weights (*.safetensors or pytorch_model.bin)")


def _check_readable(f: Path) -> None:
    """A weights file that is a directory or unreadable, in the loader's words (safetensors reports
    both as "No such file or directory" / "No such device")."""
    if f.is_symlink() and not f.exists():  # the HF cache's snapshot link whose blob is gone
        raise ModelLoadError(f"a link to {os.readlink(f)}, which is missing (an interrupted or deleted download? "
                             "download it again)", path=f)
    if not f.is_file():
        raise ModelLoadError("not a weights file (a directory or a device)", path=f)
    try:
        with open(f, "rb"):
            pass
    except OSError as e:
        raise ModelLoadError(f"cannot read ({e.strerror or e})", path=f) from None


def _pickle_refusal(e: BaseException) -> str:
    """One line for a pickle that torch.load(weights_only=True) would not load (torch's own text is
    long, multi-line, has terminal escapes and suggests loading the file unsafely)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if m:
        return (f"refused: the pickle holds {m.group(1)}, which is not a tensor; pickle checkpoints are read only with "
                "torch.load(weights_only=True) and pickled code is never run (convert it to safetensors)")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    detail = next((ln for ln in reversed(lines) if not ln.startswith(("Weights only load failed", "Check the documentation",
                                                                       "Please file an issue", "(1)", "(2)"))), None)
    detail = detail or (lines[0] if lines else type(e).__name__)
    return f"not readable with torch.load(weights_only=True): corrupt, or not a plain state dict ({detail[:160]})"


def _on(sd: dict[str, torch.Tensor], device: torch.device | None) -> dict[str, torch.Tensor]:
    return sd if device is None else {k: v.to(device) for k, v in sd.items()}


def _load_hf_dir(name: str, path: Path, dtype: torch.dtype | str, max_context: int | None,
                 device: torch.device | None = None) -> Loaded:
    cfg = read_config(path)
    dtype = parse_dtype(dtype, cfg.get("model_type"), cfg)
    sd = read_state_dict(path)
    dv = draft_vocab_of(path, cfg.get("vocab_size"))
    if dv is not None and dv["row_ids"] is not None:
        cfg = {**cfg, "vocab_size": dv["vocab_size"]}
        sd = expand_rows(sd, dv["row_ids"], dv["vocab_size"], path)
    sd = _on(sd, device)
    params = count_params(sd, cfg)
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
    if dv is not None:
        from .drafters.vocab import is_byte_tokenizer

        if tok is not None and is_byte_tokenizer(tok):  # (`distill export --head-top` before session 42 wrote one)
            raise ModelLoadError(f"{path / 'draft_vocab.json'}: a byte-level drafter must be able to propose every byte "
                                 "(the vocabulary bridges spell any text with them); delete the file")
        if int(dv["token_ids"].max()) >= model.vocab_size:
            raise ModelLoadError(f"{path / 'draft_vocab.json'}: token ids must be distinct and within the model's "
                                 f"vocabulary (0..{model.vocab_size - 1})")
        model.draft_vocab = dv["token_ids"]
    from .chain_scorer import scorer_of

    try:  # hybrid:K's choice among draft sources (engine/chain_scorer.py)
        model.chain_scorer = scorer_of(path) if READ_CHAIN_SCORER else None
    except ValueError as e:
        raise ModelLoadError(f"{e}; delete it or refit it with `specchat distill scorer`") from None
    return Loaded(model, tok, name, path, "hf", cfg, params=params)


READ_CHAIN_SCORER = True  # `distill scorer` loads a drafter without the scorer it is about to replace


def read_draft_vocab_file(path: Path, rows: int | None) -> dict[str, Any]:
    """A drafter's draft vocabulary, written by `specchat distill train` / `distill export`:
    {"token_ids": [...]}, the only tokens it proposes (its output layer shrinks to them), and, in a
    row-reduced export, {"row_ids": [...], "vocab_size": V}: row r of the stored embedding is the
    target's token row_ids[r], -1 the one row shared by every token not listed (the drafter then
    stores ``rows`` embedding rows instead of V; the loader widens it back, expand_rows).
    Returns {"token_ids": tensor, "row_ids": tensor | None, "vocab_size": int | None}."""
    try:
        d = json.loads(read_small(path, "draft vocabulary", MAX_CONFIG_BYTES, ModelLoadError))
        t = torch.tensor(d["token_ids"], dtype=torch.long)
        r = torch.tensor(d["row_ids"], dtype=torch.long) if "row_ids" in d else None
        V = int(d["vocab_size"]) if r is not None else rows
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ModelLoadError(f"{path}: not a draft vocabulary ({str(e).splitlines()[0][:120]})") from None
    if r is not None:
        known = r[r >= 0]
        if (r.dim() != 1 or rows is None or r.numel() != rows or V <= 0 or int(r.min()) < -1 or int(r.max()) >= V
                or (r < 0).sum() > 1 or known.unique().numel() != known.numel()):
            raise ModelLoadError(f"{path}: row_ids must name each of the config's {rows} embedding rows once "
                                 f"(distinct token ids below vocab_size {V}, at most one -1)")
        if not bool(torch.isin(t, known).all()):
            raise ModelLoadError(f"{path}: every draft token must have an embedding row of its own (in row_ids)")
    if (t.dim() != 1 or t.numel() == 0 or int(t.min()) < 0 or (V is not None and int(t.max()) >= V)
            or t.unique().numel() != t.numel()):
        top = "?" if V is None else V - 1
        raise ModelLoadError(f"{path}: token ids must be distinct and within the model's vocabulary (0..{top})")
    return {"token_ids": t, "row_ids": r, "vocab_size": V}


def draft_vocab_of(path: Path, rows: int | None) -> dict[str, Any] | None:
    """The drafter directory ``path``'s draft_vocab.json (read_draft_vocab_file), or None without one."""
    f = path / "draft_vocab.json"
    return read_draft_vocab_file(f, rows) if f.exists() else None


ROW_KEYS = ("embeddings.weight", "embed_tokens.weight", "lm_head.weight")  # the (vocab, d) tensors a row map widens


def expand_rows(sd: dict[str, torch.Tensor], row_ids: torch.Tensor, vocab_size: int, where: object) -> dict[str, torch.Tensor]:
    """A row-reduced drafter's embedding (and untied head) widened to the full vocabulary: token
    row_ids[r] takes stored row r, every other token the shared row (row_ids == -1; zeros where
    there is none). Exact for the listed tokens, so the widened drafter computes what was trained."""
    out = dict(sd)
    fill = torch.nonzero(row_ids < 0).flatten()
    known = torch.nonzero(row_ids >= 0).flatten()
    hit = False
    for k, w in sd.items():
        if not k.endswith(ROW_KEYS):
            continue
        if w.dim() != 2 or w.shape[0] != row_ids.numel():
            raise ModelLoadError(f"{where}: {k} has {w.shape[0]} rows, the draft vocabulary's row_ids {row_ids.numel()}")
        full = w[fill[0]].repeat(vocab_size, 1) if len(fill) else w.new_zeros(vocab_size, w.shape[1])
        full[row_ids[known]] = w[known]
        out[k], hit = full, True
    if not hit:
        raise ModelLoadError(f"{where}: draft_vocab.json has row_ids but the weights have no embedding to widen")
    return out


def _load_gguf(name: str, path: Path, dtype: torch.dtype | str, max_context: int | None,
               device: torch.device | None = None) -> Loaded:
    from .gguf import load_gguf

    ck = load_gguf(path, defer=device is None and _may_keep_quantized(dtype))
    params = count_params(ck.state_dict, ck.config)  # (deferred tensors are shape-only "meta" ones)
    act8 = dtype == "q8" or (dtype == "auto" and _auto_q8(ck))
    dtype = parse_dtype(dtype, ck.config.get("model_type"))
    _check_config_values(ck.config, path)
    model, kept = None, 0
    if ck.deferred and _keeps_quantized(ck, dtype):
        # the kept projections come straight from their blocks (no fp32 copy is ever built); any
        # placeholder left (a fused group whose matrices are quantised differently) -> the full load
        model = build(ck.config, ck.state_dict, dtype, max_context, str(path))
        kept = _keep_quantized(model, ck, dtype, act8)
        if _holds_meta(model):
            model, kept = None, 0
    if model is None:
        ck.materialize()
        model = build(ck.config, _on(ck.state_dict, device), dtype, max_context, str(path))
        kept = _keep_quantized(model, ck, dtype, act8) if device is None else 0
    _check_tokenizer(ck.tokenizer, model, path)
    return Loaded(model, ck.tokenizer, name, path, "gguf", ck.config, getattr(ck, "quant", None), kept, act8=act8 and kept > 0,
                  params=params)


def count_params(sd: dict[str, torch.Tensor], cfg: dict[str, Any]) -> int:
    tied = cfg.get("tie_word_embeddings") and "model.embed_tokens.weight" in sd
    return sum(t.numel() for k, t in sd.items() if not (tied and k == "lm_head.weight"))


def _auto_q8(ck: Any) -> bool:
    """--dtype auto for a GGUF checkpoint: the q8 compute type where its products take the model's
    quantised blocks and a start-up probe finds them faster (engine/dtype_probe.py)."""
    from .dtype_probe import auto_q8

    return bool(ck.blocks) and auto_q8(ck.config.get("model_type"), {q for q, _ in ck.blocks.values()})


def _quant_path_on() -> bool:
    """The quantised CPU products are on: SPECCHAT_QUANT and linear.c's kernels."""
    from .models import quant
    from .models.common import native_linear

    return quant.enabled() and native_linear()


def _may_keep_quantized(dtype: torch.dtype | str) -> bool:
    """Before the header is read: whether the CPU quantised path can apply (else the fp32 copies
    are read at once rather than deferred and read again)."""
    return dtype not in (torch.bfloat16, torch.float16, "bf16", "bfloat16", "fp16", "float16") and _quant_path_on()


def _keeps_quantized(ck: Any, dtype: torch.dtype) -> bool:
    """Whether a CPU model of this checkpoint multiplies its Q4_1 / Q8_0 matrices from their blocks."""
    return dtype == torch.float32 and bool(ck.blocks) and _quant_path_on()


def _keep_quantized(model: CausalLM, ck: Any, dtype: torch.dtype, act8: bool = False) -> int:
    """fp32 on CPU with linear.c: keep the GGUF's Q4_1 / Q8_0 matrices in their blocks (bit-identical
    products from ~1/5 of the bytes; engine/models/quant.py). SPECCHAT_QUANT=0 keeps fp32. ``act8``:
    the q8 compute type's records (8-bit activations, quant_a8.c). Returns how many projections
    were kept quantised."""
    if not _keeps_quantized(ck, dtype) or not hasattr(model, "keep_quantized"):
        return 0
    return model.keep_quantized(ck.blocks, act8=act8)


def _holds_meta(obj: Any, depth: int = 0) -> bool:
    """Whether a built model still holds a "meta" placeholder of a deferred GGUF weight anywhere in
    its attributes (tensors, ``Linear``s, and the lists / dicts / tuples holding them)."""
    from .models.common import Linear

    if isinstance(obj, torch.Tensor):
        return obj.is_meta
    if depth > 4:
        return False
    if isinstance(obj, Linear):
        return any(_holds_meta(getattr(obj, k), depth + 1) for k in ("_blocks", "_dense", "_packed", "_qrec"))
    if isinstance(obj, dict):
        return any(_holds_meta(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_meta(v, depth + 1) for v in obj)
    if depth == 0:
        return any(_holds_meta(v, 1) for v in vars(obj).values())
    return False


def _check_tokenizer(tok: Any, model: CausalLM, path: Path) -> None:
    if tok is not None and tok.vocab_size > model.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's embedding has only {model.vocab_size} rows (mismatched tokenizer)")
