"""Review s44: pure-SSM (Mamba-1, Mamba-2) and hybrid (Granite-4.0-H) targets through the CLI and
the engine, with every strategy. Each test here failed before its fix."""

from __future__ import annotations

import math

import pytest
import torch

from .tiny import saved


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("s44"))


# ---- transformers 5.x config.json: inf written as {"__float__": "Infinity"} -----------------------
@pytest.mark.parametrize("kind", ["mamba2", "granite"])
def test_config_file_inf_sentinel_is_a_float(kind, root):
    """transformers 5.x save_pretrained writes Mamba-2's time_step_limit as
    [0.0, {"__float__": "Infinity"}]: read_config_file gives the float, so `bench --tree-scaling
    --target DIR/config.json` (a random-weight model from the same file, built by transformers'
    strict config classes) no longer fails with "transformers cannot build this config
    (StrictDataclassFieldValidationError ... time_step_limit)"."""
    from engine.bench_ssm import random_model
    from engine.loading import read_config_file

    path = saved(kind, root) / "config.json"
    assert '"__float__"' in path.read_text()  # the checkpoint really carries the sentinel
    cfg = read_config_file(path)
    lo, hi = cfg["time_step_limit"]
    assert lo == 0.0 and math.isinf(hi)
    m = random_model(path, torch.float32)  # raised SpecchatError before the fix
    m.allocate()
    m.prefill([1, 2, 3])
    assert torch.isfinite(m.verify([4], [-1])).all()
