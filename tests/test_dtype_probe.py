"""--dtype auto's probe is remembered per machine (engine/dtype_probe.py): the compute type, and with
it every greedy reply, does not change between launches because one probe ran on a busy machine."""

from __future__ import annotations

import json

import pytest

from engine import dtype_probe


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECCHAT_REPROBE", raising=False)
    dtype_probe.q8_costs.cache_clear()
    dtype_probe.cpu_costs.cache_clear()
    yield tmp_path / "specchat" / "dtype-probe.json"
    dtype_probe.q8_costs.cache_clear()
    dtype_probe.cpu_costs.cache_clear()


def _counting(monkeypatch, name, values):
    calls = []

    def measure(*a):
        calls.append(a)
        return dict(values[min(len(calls), len(values)) - 1])

    monkeypatch.setattr(dtype_probe, name, measure)
    return calls


def test_a_probe_is_measured_once_per_machine_and_remembered(probe_dir, monkeypatch):
    calls = _counting(monkeypatch, "_measure_q8_costs", [{"fp32": 2.0, "q8": 1.0}, {"fp32": 1.0, "q8": 2.0}])
    assert dtype_probe.q8_costs() == {"fp32": 2.0, "q8": 1.0}
    assert len(calls) == 1 and probe_dir.is_file()
    dtype_probe.q8_costs.cache_clear()  # a new process: the remembered measure, not a new one
    assert dtype_probe.q8_costs() == {"fp32": 2.0, "q8": 1.0} and len(calls) == 1
    # another probe of the same machine joins the same entry, the first one kept
    bf = _counting(monkeypatch, "_measure_cpu_costs", [{"fp32": 1.0, "bf16": 3.0}])
    assert dtype_probe.cpu_costs() == {"fp32": 1.0, "bf16": 3.0} and len(bf) == 1
    book = json.loads(probe_dir.read_text())
    assert len(book) == 1 and len(next(iter(book.values()))) == 2
    # SPECCHAT_REPROBE=1 measures again and remembers the new measure
    monkeypatch.setenv("SPECCHAT_REPROBE", "1")
    dtype_probe.q8_costs.cache_clear()
    assert dtype_probe.q8_costs() == {"fp32": 1.0, "q8": 2.0} and len(calls) == 2
    monkeypatch.delenv("SPECCHAT_REPROBE")
    dtype_probe.q8_costs.cache_clear()
    assert dtype_probe.q8_costs() == {"fp32": 1.0, "q8": 2.0} and len(calls) == 2


def test_another_machine_or_torch_measures_its_own(probe_dir, monkeypatch):
    calls = _counting(monkeypatch, "_measure_q8_costs", [{"fp32": 2.0, "q8": 1.0}, {"fp32": 1.0, "q8": 3.0}])
    assert dtype_probe.q8_costs()["q8"] == 1.0
    dtype_probe.q8_costs.cache_clear()
    monkeypatch.setattr(dtype_probe, "_machine_key", lambda: "another-cpu")
    assert dtype_probe.q8_costs()["q8"] == 3.0 and len(calls) == 2
    assert len(json.loads(probe_dir.read_text())) == 2


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"q8_costs/576x1536": {"fp32": -1, "q8": "x"}}}',
                                     '{"KEY": {"q8_costs/576x1536": {}}}', '{"KEY": 7}'])
def test_a_damaged_file_means_measuring_again(probe_dir, monkeypatch, content):
    probe_dir.parent.mkdir(parents=True)
    probe_dir.write_text(content.replace("KEY", dtype_probe._machine_key()))
    calls = _counting(monkeypatch, "_measure_q8_costs", [{"fp32": 2.0, "q8": 1.0}])
    assert dtype_probe.q8_costs() == {"fp32": 2.0, "q8": 1.0} and len(calls) == 1
    assert json.loads(probe_dir.read_text())[dtype_probe._machine_key()]["q8_costs/576x1536"] == {"fp32": 2.0, "q8": 1.0}


def test_an_unwritable_cache_only_means_measuring(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file where the directory would be
    dtype_probe.q8_costs.cache_clear()
    try:
        calls = _counting(monkeypatch, "_measure_q8_costs", [{"fp32": 2.0, "q8": 1.0}])
        assert dtype_probe.q8_costs() == {"fp32": 2.0, "q8": 1.0} and len(calls) == 1
    finally:
        dtype_probe.q8_costs.cache_clear()


def test_the_real_probes_measure_positive_costs(probe_dir):
    c = dtype_probe.cpu_costs()
    assert set(c) == {"fp32", "bf16"} and min(c.values()) > 0
    from engine import native

    if native.lib() is not None:
        q = dtype_probe.q8_costs()
        assert set(q) == {"fp32", "q8"} and min(q.values()) > 0
    assert probe_dir.is_file()


def test_packed_rows_verdict_is_remembered_and_needs_a_clear_gain(probe_dir, monkeypatch):
    """dtype_probe.packed_rows: 4 rows only where a 4-row pass measured at least 5% faster than a
    2-row one, and that verdict kept per machine (a busy launch must not flip the kernels' rows)."""
    import torch

    calls = _counting(monkeypatch, "_measure_packed_rows", [{"2": 1.0, "4": 0.9}, {"2": 1.0, "4": 0.99}])
    assert dtype_probe.packed_rows(torch.bfloat16) == 4 and len(calls) == 1
    assert dtype_probe.packed_rows(torch.bfloat16) == 4 and len(calls) == 1  # remembered
    assert dtype_probe.packed_rows(torch.float32) == 2 and len(calls) == 2  # its own measure: 1% is not enough


def test_packed_rows_measure_times_both_row_counts():
    import torch

    from engine.models import common

    if not common.packs(torch.bfloat16):
        pytest.skip("oneDNN does not pack bf16 on this CPU")
    c = dtype_probe._measure_packed_rows(torch.bfloat16, mb=8)
    assert set(c) == {"2", "4"} and all(0 < v < 1 for v in c.values())
