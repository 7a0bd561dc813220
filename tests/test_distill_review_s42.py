"""Review (session 42) of `specchat distill`: `distill topk` resumed with another target or
settings, and `distill export --head-top` / `--shrink-vocab` on a byte-level drafter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.cli import main
from engine.errors import ModelLoadError
from tests.test_distill import _one_line_error, _tiny_replies
from tests.test_distill_review_s41 import _SMALL, _target

_ROWS = [{"id": f"p{i}", "prompt_ids": [1, 30 + i, 40], "response_ids": [50 + i, 60, 2]} for i in range(5)]


def _data(root: Path, rows=_ROWS) -> Path:
    d = root / "d"
    d.mkdir(exist_ok=True)
    (d / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*.pt"))}


def test_distill_topk_refuses_to_resume_with_another_target_or_settings(tmp_path, capsys):
    """A resumed `distill topk` kept the parts already on disk whatever target made them, so a resume
    with another --target (or another checkpoint under the same name, or another --dtype) silently
    mixed two targets' top-k in one set for `train --kd`. Refused in one line naming how to start
    over, the parts untouched, the missing one not written; the same target and settings resume."""
    from engine.distill_train import load_topk

    a, b = _target(tmp_path, "a", 0), _target(tmp_path, "b", 1)
    twin = _target(tmp_path / "v2", "a", 1)  # another checkpoint, the same name ("a")
    data = _data(tmp_path)
    out = data / "topk2"
    common = ["distill", "topk", "--data", str(data), "--k", "2"]
    assert main([*common, "--target", str(a), "--chunk", "2"]) == 0
    (out / "part-00002.pt").unlink()  # a run stopped before its last part
    before = _parts(out)
    assert sorted(before) == ["part-00000.pt", "part-00001.pt"]
    for extra, says in (
            (["--target", str(b), "--chunk", "2"], "its parts were made by target 'a'"),
            (["--target", str(twin), "--chunk", "2"], "this run's is 'a' (weights sha256"),
            (["--target", str(a), "--chunk", "2", "--dtype", "bf16"], "computed in float32, this run's target computes in bfloat16"),
            (["--target", str(a), "--chunk", "3"], "made with --chunk 2, this run has 3")):
        _one_line_error(capsys, [*common, *extra], says)
        _one_line_error(capsys, [*common, *extra], f"remove {out} to start over")
        assert _parts(out) == before
    assert main([*common, "--target", str(a), "--chunk", "2"]) == 0  # the same target and settings resume
    assert _parts(out)["part-00000.pt"] == before["part-00000.pt"] and (out / "part-00002.pt").exists()
    got = load_topk(data, 2)
    assert set(got) == {r["id"] for r in _ROWS} and all(t.shape == (3, 2) for t, _ in got.values())
    rec = json.loads((out / "topk.json").read_text())
    assert (rec["target"], rec["compute"], rec["k"], rec["chunk"]) == ("a", "float32", 2, 2) and len(rec["weights"]) == 64
    # a record left by a run stopped before its first part binds nothing: another target starts afresh
    shutil.rmtree(out)
    out.mkdir()
    (out / "topk.json").write_text(json.dumps(rec))
    assert main([*common, "--target", str(b), "--chunk", "2"]) == 0
    assert json.loads((out / "topk.json").read_text())["target"] == "b" and len(_parts(out)) == 3


def test_distill_topk_redoes_a_part_whose_replies_changed_under_the_same_ids(tmp_path):
    """A part was done when its reply ids matched: replies made again (`distill data` redone into the
    same directory) kept the old replies' top-k, of other lengths, which `train --kd` then dropped
    for a one-hot target without a word."""
    from engine.distill_train import load_topk

    a = _target(tmp_path, "a")
    data = _data(tmp_path)
    argv = ["distill", "topk", "--data", str(data), "--target", str(a), "--k", "2", "--chunk", "2"]
    assert main(argv) == 0
    rows = [dict(r, response_ids=[50, 61, 62, 2]) if r["id"] == "p3" else r for r in _ROWS]
    _data(tmp_path, rows)
    kept = (data / "topk2" / "part-00000.pt").read_bytes()
    assert main(argv) == 0
    got = load_topk(data, 2)
    assert got["p3"][0].shape == (4, 2) and got["p0"][0].shape == (3, 2)
    assert (data / "topk2" / "part-00000.pt").read_bytes() == kept  # its replies are the same: not redone


def test_distill_topk_parts_without_a_record_are_refused_not_guessed_at(tmp_path, capsys):
    """Parts written before runs recorded their target (or whose record is damaged) cannot be matched
    to this run: one line saying so and how to start over, the parts kept; starting over works."""
    a = _target(tmp_path, "a")
    data = _data(tmp_path)
    out = data / "topk2"
    argv = ["distill", "topk", "--data", str(data), "--target", str(a), "--k", "2", "--chunk", "2"]
    assert main(argv) == 0
    before = _parts(out)
    (out / "topk.json").write_text("{half")
    _one_line_error(capsys, argv, f"{out / 'topk.json'}: damaged")
    (out / "topk.json").unlink()  # parts as an earlier version wrote them
    _one_line_error(capsys, argv, f"{out}: its 3 part(s) were written before `distill topk` recorded the target")
    _one_line_error(capsys, argv, f"remove {out} to start over")
    assert _parts(out) == before and not (out / "topk.json").exists()
    shutil.rmtree(out)
    assert main(argv) == 0 and (out / "topk.json").exists() and len(_parts(out)) == 3


def test_export_head_top_or_shrink_vocab_of_a_byte_drafter_is_refused(tmp_path, capsys):
    """`distill export --head-top N --head-data DATA` on a byte-level drafter counted DATA's replies,
    which are in the target's token ids, as if they were bytes: token ids 5 and 6 came out as the
    draft vocabulary's bytes 0x05 and 0x06 (with the EOS, "50% of the reply tokens"), any id past 263
    was an "outside the target's vocabulary" error, and the draft_vocab.json written was ignored by
    the bridge that drafts for a token target yet cut what `distill scorer` scores. A byte drafter
    must be able to propose every byte: refused in one line, nothing written; --shrink-vocab too
    (every byte must keep its own embedding row). The plain export still works."""
    from engine.drafters.vocab import is_byte_tokenizer
    from engine.loading import load

    data = tmp_path / "d"
    _tiny_replies(data)  # reply ids 5..8: below 264, so the old export went ahead
    byte = tmp_path / "byte"
    assert main(["distill", "train", "--data", str(data), "--out", str(byte), *_SMALL, "--byte-level"]) == 0
    top = tmp_path / "top"
    _one_line_error(capsys, ["distill", "export", "--from", str(byte), "--to", str(top), "--head-top", "2",
                             "--head-data", str(data)], "a byte-level drafter (256 bytes + specials), which --head-top does not apply to")
    _one_line_error(capsys, ["distill", "export", "--from", str(byte), "--to", str(top), "--shrink-vocab", str(data)],
                    "which --shrink-vocab does not apply to")
    assert not top.exists()
    assert main(["distill", "export", "--from", str(byte), "--to", str(top)]) == 0
    got = load(str(top))
    assert is_byte_tokenizer(got.tokenizer) and got.model.vocab_size == 264 and getattr(got.model, "draft_vocab", None) is None
    # one an older export cut (a draft_vocab.json beside a byte tokenizer) is refused at load, in one line
    (top / "draft_vocab.json").write_text(json.dumps({"token_ids": [5, 6, 257]}))
    with pytest.raises(ModelLoadError, match="a byte-level drafter must be able to propose every byte"):
        load(str(top))
