"""Review (session 41) of `specchat distill`: resuming after a kill or with other arguments, --init
from another model, exporting over an earlier export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.cli import main
from tests.test_distill import _TINIER, _TINY, _one_line_error, _tiny_replies

_SMALL = [*_TINY, *_TINIER, "--holdout", "0.25"]


def _target(root: Path, name: str, seed: int = 0) -> Path:
    """A tiny random Llama over SmolLM2's vocabulary with SmolLM2's tokenizer: a target `distill
    data` decodes in about a second."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = root / name
    if not (d / "config.json").exists():
        torch.manual_seed(seed)
        LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, bos_token_id=1,
                                     eos_token_id=2)).save_pretrained(d)
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy2(Path("assets/mamba-drafter-smollm2") / f, d / f)
    return d


def test_resuming_training_with_another_shape_or_a_damaged_state_is_one_line(tmp_path, capsys):
    """A train_state.pt saved by a run of another --d-model (or --byte-level), or damaged (a disk that
    filled, a copy cut short), gave a RuntimeError / EOFError traceback on resume; the state is kept."""
    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "t"
    argv = ["distill", "train", "--data", str(data), "--out", str(out), *_SMALL, "--save-every", "1"]
    assert main(argv) == 0
    state = out / "train_state.pt"
    saved = state.read_bytes()
    _one_line_error(capsys, argv + ["--d-model", "64", "--steps", "2"], "another shape than this run's")
    _one_line_error(capsys, argv + ["--byte-level", "--steps", "2"], "another shape than this run's")
    assert state.read_bytes() == saved
    for damaged in (saved[: len(saved) // 2], b""):
        state.write_bytes(damaged)
        _one_line_error(capsys, argv + ["--steps", "2"], f"{state}: damaged or not a training state")
        assert state.read_bytes() == damaged  # kept: the user decides


def test_init_from_a_model_that_is_no_mamba2_drafter_is_one_line(tmp_path, capsys):
    """--init a Llama (or Mamba-1) directory with the target's vocabulary: a
    StrictDataclassClassValidationError traceback from transformers' Mamba2Config."""
    from transformers import MambaConfig, MambaForCausalLM

    data = tmp_path / "d"
    _tiny_replies(data)
    llama = _target(tmp_path, "llama")
    mamba = tmp_path / "mamba1"
    MambaForCausalLM(MambaConfig(vocab_size=49152, hidden_size=16, num_hidden_layers=1, state_size=4)).save_pretrained(mamba)
    for init, kind in ((llama, "llama"), (mamba, "mamba")):
        _one_line_error(capsys, ["distill", "train", "--data", str(data), "--out", str(tmp_path / "o"), *_SMALL,
                                 "--init", str(init)], f"--init {init}: a {kind} model, not a Mamba-2 drafter")


def test_export_over_an_earlier_export_leaves_none_of_its_files(tmp_path, capsys):
    """`distill export --to DIR` where DIR holds an earlier export: a draft_vocab.json the new drafter
    has none of (a byte-level one) stayed and silently cut its proposals to the old token list, and a
    chain_scorer.json fitted to the old weights stayed beside the new ones."""
    from engine.loading import load

    data = tmp_path / "d"
    _tiny_replies(data)
    tok, byte = tmp_path / "tok", tmp_path / "byte"
    assert main(["distill", "train", "--data", str(data), "--out", str(tok), *_SMALL]) == 0
    assert main(["distill", "train", "--data", str(data), "--out", str(byte), *_SMALL, "--byte-level"]) == 0
    assert (tok / "draft_vocab.json").exists() and not (byte / "draft_vocab.json").exists()
    dst = tmp_path / "shipped"
    assert main(["distill", "export", "--from", str(tok), "--to", str(dst)]) == 0
    (dst / "chain_scorer.json").write_text("{}")  # `distill scorer --drafter shipped`: fitted to tok's weights
    (dst / "README.md").write_text("mine")  # not the export's: kept
    capsys.readouterr()
    assert main(["distill", "export", "--from", str(byte), "--to", str(dst)]) == 0
    assert "chain_scorer.json" in capsys.readouterr().err  # said, as `distill train` says it
    assert not (dst / "draft_vocab.json").exists() and not (dst / "chain_scorer.json").exists()
    assert (dst / "README.md").read_text() == "mine"
    got = load(str(dst)).model
    assert got.vocab_size == 264 and getattr(got, "draft_vocab", None) is None


def _replies_of(out: Path) -> dict:
    return {r["id"]: r for r in map(json.loads, (out / "responses.jsonl").read_text().splitlines())}


def test_distill_data_refuses_to_resume_with_another_target_or_settings(tmp_path, capsys):
    """A resumed `distill data` took another --target's replies (its tokenizer may be another), another
    --max-new-tokens' or, with another --seed, skipped the new set's prompts whose ids were done (other
    texts under the same ids): all silently in one responses.jsonl. Refused, one line, nothing written;
    the same settings resume, and a set without the record (made before it) resumes and gains it."""
    a, b = _target(tmp_path, "a", 0), _target(tmp_path, "b", 1)
    out = tmp_path / "d"
    common = ["distill", "data", "--out", str(out), "--n", "4", "--batch", "2"]
    assert main([*common, "--target", str(a), "--max-new-tokens", "3", "--limit", "2"]) == 0
    before = (out / "responses.jsonl").read_bytes()
    assert len(before.splitlines()) == 2
    for extra, says in ((["--target", str(b), "--max-new-tokens", "3"], "target"),
                        (["--target", str(a), "--max-new-tokens", "5"], "--max-new-tokens"),
                        (["--target", str(a), "--max-new-tokens", "3", "--seed", "7"], "--seed")):
        _one_line_error(capsys, [*common, *extra], says)
        assert (out / "responses.jsonl").read_bytes() == before
    assert main([*common, "--target", str(a), "--max-new-tokens", "3", "--limit", "1"]) == 0  # the same settings resume
    (out / "data.json").unlink()  # a set made before the record
    assert main([*common, "--target", str(a), "--max-new-tokens", "3"]) == 0
    assert len(_replies_of(out)) == 4 and json.loads((out / "data.json").read_text())["max_new_tokens"] == 3


def test_distill_data_into_a_shipped_xz_set_is_refused(tmp_path, capsys):
    """`distill data --out` a set shipped as responses.jsonl.xz saw no finished replies (it reads the
    plain file only), answered every prompt again into a new responses.jsonl, and `distill train` then
    read only that file: the shipped replies silently left out of training."""
    import lzma

    out = tmp_path / "shipped"
    out.mkdir()
    with lzma.open(out / "responses.jsonl.xz", "wt") as f:
        f.write(json.dumps({"id": "p00000", "prompt_ids": [1, 2], "response_ids": [3, 4]}) + "\n")
    _one_line_error(capsys, ["distill", "data", "--out", str(out), "--target", str(_target(tmp_path, "a")), "--n", "2"],
                    "responses.jsonl.xz")
    assert sorted(p.name for p in out.iterdir()) == ["responses.jsonl.xz"]


def test_distill_topk_redoes_a_part_whose_replies_grew(tmp_path):
    """`distill topk` skipped every existing part: the last one, written while the set held fewer
    replies than --chunk, was kept after `distill data` added more, so the replies that filled its
    chunk never got top-k targets (`train --kd` then fell back to one-hot for them, silently)."""
    from engine.distill_train import load_topk

    target = _target(tmp_path, "a")
    data = tmp_path / "d"
    data.mkdir()
    rows = [{"id": f"p{i}", "prompt_ids": [1, 30 + i, 40], "response_ids": [50 + i, 60, 2]} for i in range(5)]
    (data / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    argv = ["distill", "topk", "--data", str(data), "--target", str(target), "--k", "2", "--chunk", "4"]
    assert main(argv) == 0
    assert set(load_topk(data, 2)) == {"p0", "p1", "p2"}
    with (data / "responses.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[3:]))
    assert main(argv) == 0
    got = load_topk(data, 2)
    assert set(got) == {f"p{i}" for i in range(5)} and all(t.shape == (3, 2) for t, _ in got.values())


def test_a_full_disk_while_saving_the_training_state_is_one_line_and_keeps_the_last_one(tmp_path, capsys, monkeypatch):
    """torch.save failing (disk full) mid-run was an OSError traceback that left train_state.tmp behind."""
    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "t"
    argv = ["distill", "train", "--data", str(data), "--out", str(out), *_SMALL, "--save-every", "1"]
    assert main(argv) == 0
    before = (out / "train_state.pt").read_bytes()

    def full(obj, f, *a, **kw):
        Path(f).write_bytes(b"PK half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    capsys.readouterr()
    assert main(argv + ["--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot save the training state" in err.strip().splitlines()[-1]
    assert "No space left on device" in err.strip().splitlines()[-1]
    assert (out / "train_state.pt").read_bytes() == before and not (out / "train_state.tmp").exists()
