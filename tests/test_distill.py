"""`specchat distill data`: the project's prompt set and resumable, incremental reply files."""

from __future__ import annotations

import json

from engine.cli import main
from engine.distill_prompts import eval_texts, make_prompts


def test_prompt_set_is_deterministic_varied_and_disjoint_from_eval():
    a, b = make_prompts(500, seed=0), make_prompts(500, seed=0)
    assert a == b and len({p["text"] for p in a}) == 500
    assert len({p["kind"] for p in a}) >= 8
    assert not {p["text"] for p in make_prompts(3000)} & eval_texts()


def test_distill_data_resumes_without_duplicates(tmp_path, smollm2_gguf_path):
    out = tmp_path / "d"
    argv = ["distill", "data", "--out", str(out), "--n", "6", "--max-new-tokens", "6", "--limit", "2"]
    assert main(argv) == 0
    assert main(argv) == 0  # resumes: the next two prompts
    lines = [json.loads(x) for x in (out / "responses.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == ["p00000", "p00001", "p00002", "p00003"]
    assert all(1 <= len(x["response_ids"]) <= 6 and x["prompt_ids"] for x in lines)
    with (out / "responses.jsonl").open("a") as f:
        f.write('{"id": "p0000')  # a line cut by kill -9
    assert main(["distill", "data", "--out", str(out), "--n", "6", "--max-new-tokens", "6"]) == 0
    ids = [json.loads(x)["id"] for x in (out / "responses.jsonl").read_text().splitlines()]
    assert sorted(ids) == [f"p0000{i}" for i in range(6)]
