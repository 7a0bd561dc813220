"""`specchat distill data`: the project's prompt set and resumable, incremental reply files."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    ids = [x["id"] for x in lines]  # the prompts in a seeded shuffle: two, then the next two
    assert len(set(ids)) == 4 and set(ids) <= {f"p0000{i}" for i in range(6)}
    assert all(1 <= len(x["response_ids"]) <= 6 and x["prompt_ids"] for x in lines)
    with (out / "responses.jsonl").open("a") as f:
        f.write('{"id": "p0000')  # a line cut by kill -9
    assert main(["distill", "data", "--out", str(out), "--n", "6", "--max-new-tokens", "6"]) == 0
    ids = [json.loads(x)["id"] for x in (out / "responses.jsonl").read_text().splitlines()]
    assert sorted(ids) == [f"p0000{i}" for i in range(6)]


def test_distill_train_resumes_and_saves_a_loadable_drafter(tmp_path, smollm2_gguf_path):
    from engine.loading import load
    from engine.models.mamba2 import Mamba2

    data = tmp_path / "d"
    assert main(["distill", "data", "--out", str(data), "--n", "4", "--max-new-tokens", "8"]) == 0
    out = tmp_path / "drafter"
    common = ["distill", "train", "--data", str(data), "--out", str(out), "--d-model", "64", "--layers", "1",
              "--head-dim", "32", "--d-state", "16", "--batch", "2", "--seq-len", "64", "--save-every", "1", "--holdout", "0.25"]
    assert main(common + ["--steps", "2"]) == 0
    import torch

    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 2
    (out / "chain_scorer.json").write_text("{}")  # fitted to the weights the next save replaces
    assert main(common + ["--steps", "3"]) == 0  # resumes: one more step
    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 3
    assert not (out / "chain_scorer.json").exists()
    drafter = load(str(out))
    assert isinstance(drafter.model, Mamba2) and drafter.tokenizer.vocab_size == 49152
    assert json.loads((out / "distill.json").read_text())["steps"] == 3
    shipped = tmp_path / "shipped"
    assert main(["distill", "export", "--from", str(out), "--to", str(shipped), "--dtype", "bf16"]) == 0
    assert not (shipped / "train_state.pt").exists() and (shipped / "draft_vocab.json").exists()
    small = load(str(shipped), dtype="bf16")
    full = load(str(out), dtype="bf16")
    assert torch.equal(small.model.embed, full.model.embed)  # bf16 on disk = bf16 after load
    assert small.model.draft_vocab.tolist() == full.model.draft_vocab.tolist()


def test_distill_train_amp_trains_in_bf16_autocast_and_keeps_fp32_weights(tmp_path, capsys):
    """--amp bf16 runs the forward pass under bf16 autocast (on a CPU here; auto picks it on CUDA):
    the loss falls over a few steps on a tiny set, and the saved weights and optimiser stay fp32."""
    import torch

    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "amp"
    assert main(["distill", "train", "--data", str(data), "--out", str(out), *_TINY, "--batch", "4", "--seq-len", "32",
                 "--steps", "30", "--lr", "3e-3", "--holdout", "0.25", "--amp", "bf16", "--save-every", "1000"]) == 0
    err = capsys.readouterr().err
    assert "forward in bf16 autocast" in err
    losses = [float(m) for m in re.findall(r"step \d+/30 loss ([0-9.]+)", err)]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    state = torch.load(out / "train_state.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    assert json.loads((out / "distill.json").read_text())["args"]["amp"] == "bf16"


def _tiny_replies(data: Path, n: int = 8) -> None:
    import torch

    data.mkdir()
    g = torch.Generator().manual_seed(0)
    with open(data / "responses.jsonl", "w") as f:
        for i in range(n):
            prompt = torch.randint(10, 200, (6,), generator=g).tolist()
            f.write(json.dumps({"id": f"p{i}", "prompt_ids": prompt, "response_ids": [5, 6, 7, 8] * 6}) + "\n")


def test_time_budget_schedule_follows_a_machine_that_slows_down(tmp_path, capsys, monkeypatch):
    """--time-budget: the learning-rate schedule's end is re-estimated from the recent rate, so a
    run whose steps slow down fourfold after the first estimate still ends its cosine (lr near 0)
    when the budget runs out, instead of stopping at a high learning rate."""
    import types

    import engine.distill_train as dt

    calls = [0]

    def clock() -> float:  # one call at the start, then one a step: 0.05 s a step for 40 steps, 0.2 s after
        calls[0] += 1
        n = calls[0] - 1
        return 0.05 * min(n, 40) + 0.2 * max(0, n - 40)

    monkeypatch.setattr(dt, "time", types.SimpleNamespace(perf_counter=clock))
    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "t"
    assert main(["distill", "train", "--data", str(data), "--out", str(out), *_TINY, *_TINIER, "--steps", "100000",
                 "--time-budget", "12", "--lr", "1e-3", "--holdout", "0.25", "--save-every", "1000000"]) == 0
    lines = re.findall(r"step (\d+)/(\d+) loss [0-9.]+ lr ([0-9.e+-]+)", capsys.readouterr().err)
    steps = int(lines[-1][0])
    # 2 s for 40 steps, then 10 s at 0.2 s a step: ~90 steps (the first estimate said 240)
    assert 80 <= steps <= 95 and int(lines[19][1]) > 200
    # the lr of the run's last steps: near the cosine's end (the first estimate would leave ~0.7e-3)
    assert float(lines[-3][2]) < 1e-4


def test_a_resumed_time_budget_run_keeps_its_learning_rate(tmp_path, capsys, monkeypatch):
    """A run stopped mid-schedule and resumed (--time-budget) follows the schedule it left until the
    rate is measured again: it spent its first 20 resumed steps at ~1% of --lr (a warm-up to step
    --steps/20 of a schedule ending at --steps)."""
    import types

    import engine.distill_train as dt

    calls = [0]

    def clock() -> float:  # 0.05 s a step; Ctrl-C at the 31st call of the first run
        calls[0] += 1
        if calls[0] == 31:
            raise KeyboardInterrupt
        return 0.05 * calls[0]

    monkeypatch.setattr(dt, "time", types.SimpleNamespace(perf_counter=clock))
    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "t"
    args = ["distill", "train", "--data", str(data), "--out", str(out), *_TINY, *_TINIER, "--steps", "100000",
            "--time-budget", "12", "--lr", "1e-3", "--holdout", "0.25", "--save-every", "1000000"]
    assert main(args) == 130
    first = re.findall(r"step (\d+)/(\d+) loss [0-9.]+ lr ([0-9.e+-]+)", capsys.readouterr().err)
    assert main(args) == 0
    resumed = re.findall(r"step (\d+)/(\d+) loss [0-9.]+ lr ([0-9.e+-]+)", capsys.readouterr().err)
    assert int(resumed[0][0]) > int(first[-1][0]) and int(resumed[0][1]) == int(first[-1][1])  # the same schedule
    assert float(resumed[0][2]) > 0.5e-3  # where the first run's cosine was, not 1e-3 * 31/5000


def test_distill_train_with_a_tokenizer_only_and_a_time_budget(tmp_path, smollm2_gguf_path, capsys):
    """A machine without the target's weights (a lent GPU) trains from the replies and a tokenizer
    directory; --time-budget stops it on time with the schedule ended, and saves a loadable drafter."""
    import time

    from engine.loading import load

    data = tmp_path / "d"
    assert main(["distill", "data", "--out", str(data), "--n", "4", "--max-new-tokens", "8"]) == 0
    out = tmp_path / "drafter"
    t0 = time.perf_counter()
    assert main(["distill", "train", "--data", str(data), "--out", str(out), "--tokenizer", "assets/mamba-drafter-smollm2",
                 "--d-model", "64", "--layers", "1", "--head-dim", "32", "--d-state", "16", "--batch", "2", "--seq-len", "64",
                 "--holdout", "0.25", "--steps", "100000", "--time-budget", "4", "--save-every", "1000000"]) == 0
    assert time.perf_counter() - t0 < 60
    steps = json.loads((out / "distill.json").read_text())["steps"]
    assert 20 <= steps < 100000
    drafter = load(str(out))
    assert drafter.tokenizer.vocab_size == 49152 and drafter.model.vocab_size == 49152
    capsys.readouterr()
    assert main(["distill", "train", "--data", str(data), "--out", str(tmp_path / "x"), "--tokenizer", "assets/mamba-drafter-smollm2",
                 "--target", "smollm2-135m-instruct"]) != 0
    assert "--tokenizer stands in for --target" in capsys.readouterr().err


import pytest  # noqa: E402
import torch  # noqa: E402

from tests.tiny import saved  # noqa: E402


@pytest.mark.parametrize("kind", ["llama", "llama_tied", "qwen2", "yarn_rope"])
def test_batched_greedy_equals_batch_one_greedy(tmp_path_factory, kind):
    """`distill data --batch N` decodes left-padded rows together: in float64 (no near-ties) every
    row's reply equals the engine's own batch-1 greedy reply, including rows that stop early on
    EOS while others go on, and prompts of different lengths."""
    from engine.distill import batched_greedy
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import preset

    path = saved(kind, str(tmp_path_factory.mktemp("m")))
    model = load(str(path), dtype=torch.float64).model
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in (3, 9, 1, 17, 6, 12, 5)]
    n = 12
    ref = []
    for p in prompts:
        dec = Decoder(model)
        events, _ = run_generation(dec, p, preset("ar"), n)
        ref.append([t for e in events for t in e.emitted])
    # an EOS that some (not all) rows hit early: the most common token at step 3
    eos = {max(set(r[3] for r in ref), key=[r[3] for r in ref].count)}
    want = [r[: next((i + 1 for i, t in enumerate(r) if t in eos), n)] for r in ref]
    assert any(len(w) < n for w in want) and any(len(w) == n for w in want)
    got = dict(batched_greedy(model, prompts, n, eos, batch=3))
    assert [got[i] for i in range(len(prompts))] == want


@pytest.mark.slow  # ~15 s; CI's slow set runs it (the default suite is near its 15 minutes)
def test_distill_train_byte_level_drafter(tmp_path, smollm2_gguf_path):
    """--byte-level: the same replies as UTF-8 bytes; the saved drafter loads with a byte tokenizer
    and decodes the target's text back from its ids."""
    from engine.distill_train import _as_bytes, load_sequences
    from engine.loading import load
    from engine.tokenizer import ByteTokenizer

    data = tmp_path / "d"
    assert main(["distill", "data", "--out", str(data), "--n", "3", "--max-new-tokens", "8"]) == 0
    target_tok = load(str(smollm2_gguf_path)).tokenizer
    ids, start = load_sequences(data)[0]
    b, bstart = _as_bytes(target_tok, ids, start, ByteTokenizer.EOS)
    assert bytes(b[:bstart]).decode() == target_tok.decode(ids[:start])
    assert b[-1] == ByteTokenizer.EOS and "<|im_start|>assistant" in bytes(b[:bstart]).decode()
    out = tmp_path / "bytes"
    assert main(["distill", "train", "--data", str(data), "--out", str(out), "--byte-level", "--d-model", "64", "--layers", "1",
                 "--head-dim", "32", "--d-state", "16", "--batch", "2", "--seq-len", "128", "--steps", "2", "--holdout", "0.34",
                 "--eval-data", str(data)]) == 0  # --eval-data replies are turned into bytes too
    rec = json.loads((out / "distill.json").read_text())
    assert 0.0 <= rec["eval-data_top1"] <= 1.0
    drafter = load(str(out))
    assert drafter.model.vocab_size == 264 and drafter.tokenizer.vocab_size == 259
    assert drafter.tokenizer.decode(list("héllo".encode())) == "héllo"
    assert not (out / "draft_vocab.json").exists()
    # a byte drafter continues from a byte drafter (--init), under bf16 autocast too
    more = tmp_path / "more"
    assert main(["distill", "train", "--data", str(data), "--out", str(more), "--byte-level", "--init", str(out), "--batch", "2",
                 "--seq-len", "128", "--steps", "1", "--lr", "0", "--holdout", "0.34", "--amp", "bf16"]) == 0
    from safetensors.torch import load_file

    a, b = load_file(str(out / "model.safetensors")), load_file(str(more / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # lr 0: the init's weights
    # a token-level drafter is no byte drafter's start: one line, before any training
    assert main(["distill", "train", "--data", str(data), "--out", str(tmp_path / "x"), "--byte-level", "--init",
                 "assets/mamba-drafter-smollm2", "--steps", "1"]) != 0


@pytest.mark.slow  # ~15 s; CI's slow set runs it (the default suite is near its 15 minutes)
def test_distill_data_self_prompts_are_sampled_resumable_and_answered(tmp_path, smollm2_gguf_path):
    out = tmp_path / "d"
    argv = ["distill", "data", "--out", str(out), "--n", "1", "--self-prompts", "3", "--batch", "4", "--max-new-tokens", "4"]
    assert main(argv) == 0
    selfp = [json.loads(x) for x in (out / "self_prompts.jsonl").read_text().splitlines()]
    assert [p["id"] for p in selfp] == ["s00000", "s00001", "s00002"]
    assert all(len(p["text"].split()) >= 4 for p in selfp) and len({p["text"] for p in selfp}) == 3
    replies = {json.loads(x)["id"] for x in (out / "responses.jsonl").read_text().splitlines()}
    assert replies == {"p00000", "s00000", "s00001", "s00002"}
    argv[argv.index("--self-prompts") + 1] = "4"
    assert main(argv) == 0  # resumes: one more prompt, only its reply is new
    assert len((out / "self_prompts.jsonl").read_text().splitlines()) == 4
    assert len((out / "responses.jsonl").read_text().splitlines()) == 5


def test_distill_train_init_and_draft_vocabulary_by_count(tmp_path, smollm2_gguf_path):
    """--init starts from a trained (or exported bf16) drafter: same architecture, its weights, not
    a fresh model; --vocab-min-count N trains the softmax over the reply tokens seen N+ times and
    saves exactly that set as the draft vocabulary."""
    from collections import Counter

    import torch
    from safetensors.torch import load_file

    from engine.distill_train import load_sequences

    data = tmp_path / "d"
    assert main(["distill", "data", "--out", str(data), "--n", "4", "--max-new-tokens", "12"]) == 0
    first = tmp_path / "first"
    small = ["--batch", "2", "--seq-len", "64", "--save-every", "1", "--holdout", "0.25"]
    assert main(["distill", "train", "--data", str(data), "--out", str(first), "--d-model", "64", "--layers", "1",
                 "--head-dim", "32", "--d-state", "16", "--steps", "2"] + small) == 0
    shipped = tmp_path / "shipped"
    assert main(["distill", "export", "--from", str(first), "--to", str(shipped), "--dtype", "bf16"]) == 0
    tuned = tmp_path / "tuned"
    # architecture flags that disagree with --init are ignored: the init's config wins
    assert main(["distill", "train", "--data", str(data), "--out", str(tuned), "--init", str(shipped), "--d-model", "128",
                 "--layers", "3", "--steps", "1", "--lr", "0", "--vocab-min-count", "2"] + small) == 0
    cfg = json.loads((tuned / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 1
    a, b = load_file(str(shipped / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    # lr 0 (warm-up from 0, one step): the weights are the init's, widened to fp32
    name = next(k for k in a if "embed" in k)
    assert torch.equal(a[name].float(), b[name])
    # the draft vocabulary: reply tokens seen >= 2 times in the training replies (every 4th is held out)
    seqs = load_sequences(data)
    counts = Counter(t for i, (toks, start) in enumerate(seqs) if i % 4 for t in toks[start:])
    want = sorted(t for t, c in counts.items() if c >= 2)
    assert want and json.loads((tuned / "draft_vocab.json").read_text())["token_ids"] == want
    rec = json.loads((tuned / "distill.json").read_text())
    assert rec["args"]["init"] == str(shipped) and 0.0 <= rec["held_out_top1"] <= 1.0


def test_distill_data_on_another_device_goes_through_the_bare_target(tmp_path, smollm2_gguf_path, monkeypatch):
    """`distill data --device cuda` (a lent GPU) loads the target there, with no decoder, and decodes
    batched rows; no GPU here, so the device's load is the CPU's, recorded: its fp32 replies equal
    the CPU path's fp32 batched replies, and --time-budget stops early and resumes."""
    import engine.loading as loading

    seen = []
    real_load = loading.load

    def load_on(ref, **kw):
        seen.append((kw.get("device"), kw.get("dtype")))
        return real_load(ref, **{**kw, "device": None})

    monkeypatch.setattr(loading, "load", load_on)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    common = ["--n", "3", "--batch", "4", "--max-new-tokens", "6", "--dtype", "fp32"]
    assert main(["distill", "data", "--out", str(tmp_path / "gpu"), "--device", "auto", *common]) == 0
    assert seen == [("cuda", "fp32")]
    monkeypatch.setenv("SPECCHAT_QUANT", "0")  # the CPU path's fp32 weights, as a GPU's are
    assert main(["distill", "data", "--out", str(tmp_path / "cpu"), "--device", "cpu", *common]) == 0
    rows = {d: {r["id"]: r["response_ids"] for r in map(json.loads, (tmp_path / d / "responses.jsonl").read_text().splitlines())}
            for d in ("gpu", "cpu")}
    assert len(rows["gpu"]) == 3 and rows["gpu"] == rows["cpu"]
    # a spent budget stops after the first reply; a rerun finishes the rest
    out = tmp_path / "budget"
    assert main(["distill", "data", "--out", str(out), "--device", "cuda", "--time-budget", "1e-9", *common]) == 0
    assert len((out / "responses.jsonl").read_text().splitlines()) == 1
    assert main(["distill", "data", "--out", str(out), "--device", "cuda", *common]) == 0
    assert len((out / "responses.jsonl").read_text().splitlines()) == 3


def test_distill_data_on_a_device_needs_batched_rows(tmp_path, smollm2_gguf_path, monkeypatch, capsys):
    import engine.loading as loading

    real_load = loading.load
    monkeypatch.setattr(loading, "load", lambda ref, **kw: real_load(ref, **{**kw, "device": None}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the check that a GPU is there
    assert main(["distill", "data", "--out", str(tmp_path / "d"), "--device", "cuda", "--batch", "1", "--n", "1"]) != 0
    err = capsys.readouterr().err
    assert "--batch > 1" in err and "Traceback" not in err


def test_distill_data_exclude_skips_another_sets_prompts(tmp_path, smollm2_gguf_path):
    from engine.distill_prompts import make_prompts

    old = tmp_path / "old"
    old.mkdir()
    first = make_prompts(6, 1)[:3]
    (old / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in first))
    new = tmp_path / "new"
    assert main(["distill", "data", "--out", str(new), "--n", "6", "--seed", "1", "--exclude", str(old),
                 "--batch", "4", "--max-new-tokens", "2"]) == 0
    texts = {json.loads(x)["text"] for x in (new / "prompts.jsonl").read_text().splitlines()}
    assert len(texts) == 3 and not texts & {p["text"] for p in first}
    assert len((new / "responses.jsonl").read_text().splitlines()) == 3
    assert main(["distill", "data", "--out", str(new), "--n", "6", "--exclude", str(tmp_path / "nope")]) == 2


def test_distill_data_excludes_several_sets_shipped_as_xz(tmp_path, smollm2_gguf_path):
    """`--exclude A B`: the prompts of both sets are skipped, a set's prompts.jsonl.xz (as the
    shipped assets/distill/* keep them) read as the plain file."""
    import lzma

    from engine.distill_prompts import make_prompts

    pool = make_prompts(8, 1)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pool[:2]))
    with lzma.open(b / "prompts.jsonl.xz", "wt") as f:
        f.write("".join(json.dumps(p) + "\n" for p in pool[2:5]))
    new = tmp_path / "new"
    assert main(["distill", "data", "--out", str(new), "--n", "8", "--seed", "1", "--exclude", str(a), str(b),
                 "--batch", "4", "--max-new-tokens", "2"]) == 0
    texts = {json.loads(x)["text"] for x in (new / "prompts.jsonl").read_text().splitlines()}
    assert texts == {p["text"] for p in pool[5:]}


def test_distill_train_reads_several_sets_and_xz(tmp_path):
    """`--data A B` trains on both sets; a set shipped as responses.jsonl.xz reads as the plain file."""
    import lzma

    from engine.distill_train import load_sequences

    g = torch.Generator().manual_seed(0)
    rows = [{"id": f"p{i}", "kind": "t", "prompt_ids": torch.randint(3, 900, (5,), generator=g).tolist(),
             "response_ids": torch.randint(3, 900, (30,), generator=g).tolist() + [2], "text": "x"} for i in range(6)]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (plain / "responses.jsonl").write_text(text)
    with lzma.open(packed / "responses.jsonl.xz", "wt") as f:
        f.write(text)
    assert load_sequences(packed) == load_sequences(plain) and len(load_sequences(plain)) == 6
    out = tmp_path / "drafter"
    assert main(["distill", "train", "--data", str(plain), str(packed), "--out", str(out), "--tokenizer", "assets/mamba-drafter-smollm2",
                 "--d-model", "64", "--layers", "1", "--head-dim", "32", "--d-state", "16", "--batch", "2", "--seq-len", "64",
                 "--holdout", "0.25", "--steps", "2"]) == 0
    rec = json.loads((out / "distill.json").read_text())
    assert rec["replies"] == 12 and rec["data"] == f"{plain} {packed}"
    assert main(["distill", "train", "--data", str(tmp_path / "none"), "--out", str(out), "--tokenizer", "assets/mamba-drafter-smollm2"]) != 0


def test_export_refuses_its_own_source_and_damaged_weights(tmp_path, capsys):
    """`distill export --to` the --from directory rewrote the source's weights and then crashed
    (SameFileError); a truncated model.safetensors gave a SafetensorError traceback; a --to that is
    a file, or that cannot be created, gave FileExistsError / FileNotFoundError. One line each, the
    source untouched."""
    import shutil

    from engine.cli import main

    shipped, src = _drafter_copy(tmp_path)
    before = (src / "model.safetensors").read_bytes()
    for to, expect in ((src, "is the drafter being exported"), (tmp_path / "." / "drafter", "is the drafter being exported"),
                       (src / "config.json", "is not a directory"), (Path("/proc/nope"), "/proc/nope: cannot create --to")):
        capsys.readouterr()
        assert main(["distill", "export", "--from", str(src), "--to", str(to), "--dtype", "fp32"]) == 2, to
        err = capsys.readouterr().err.strip()
        assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (src / "model.safetensors").read_bytes() == before
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy2(shipped / "config.json", bad / "config.json")
    (bad / "model.safetensors").write_bytes(before[: len(before) // 2])
    assert main(["distill", "export", "--from", str(bad), "--to", str(tmp_path / "out"), "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert "corrupt or truncated safetensors file" in err and len(err.splitlines()) == 1


def test_damaged_reply_data_is_a_one_line_error(tmp_path, capsys, smollm2_gguf_path):
    """`distill ngram` / `distill train` on a corrupt responses.jsonl.xz (an LZMAError traceback), on
    records whose ids are not lists of ints (a TypeError), or on token ids outside the target's
    vocabulary (an IndexError in train; ngram wrote a datastore generate then refused); and an
    `--out` that is a directory (an IsADirectoryError after all the indexing). One line each."""
    from engine.cli import main

    def data(name, lines=None, raw=None):
        d = tmp_path / name
        d.mkdir()
        if raw is not None:
            (d / "responses.jsonl.xz").write_bytes(raw)
        else:
            (d / "responses.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
        return str(d)

    good = [{"id": i, "prompt_ids": [1, 2, 3], "response_ids": [4 + i, 5, 6, 7]} for i in range(4)]
    cases = [
        (data("xz", raw=b"not xz at all"), "cannot read the replies"),
        (data("str", [{"id": 0, "prompt_ids": [1], "response_ids": "4 5 6"}]), "line 1: prompt_ids and response_ids must be lists"),
        (data("neg", good + [{"id": 9, "prompt_ids": [1], "response_ids": [4, -2]}]), "line 5: prompt_ids and response_ids must be lists"),
        (data("oob", good + [{"id": 9, "prompt_ids": [1], "response_ids": [99999999]}]), "token id 99999999 is outside the target's vocabulary"),
    ]
    for d, expect in cases:
        for argv in (["distill", "ngram", "--data", d, "--out", str(tmp_path / "x.npz")],
                     ["distill", "train", "--data", d, "--out", str(tmp_path / "t"), "--steps", "1"]):
            capsys.readouterr()
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip()
            assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    ok = data("ok", good)
    (tmp_path / "adir.npz").mkdir()
    assert main(["distill", "ngram", "--data", ok, "--out", str(tmp_path / "adir.npz")]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["distill", "ngram", "--data", ok, "--out", str(tmp_path / "sub" / "ds"), "--min-count", "1"]) == 0
    assert (tmp_path / "sub" / "ds.npz").is_file() and str(tmp_path / "sub" / "ds.npz") in capsys.readouterr().err


def _replies(d: Path, rows) -> str:
    d.mkdir()
    (d / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(d)


def _one_line_error(capsys, argv, expect):
    capsys.readouterr()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)


_ROWS = [{"id": i, "prompt_ids": [1, 2, 3], "response_ids": [4 + i, 5, 6, 7]} for i in range(4)]
_TINY = ["--tokenizer", "assets/mamba-drafter-smollm2", "--d-model", "64", "--layers", "1", "--head-dim", "32",
         "--d-state", "16", "--batch", "2", "--seq-len", "64", "--steps", "1"]
_TINIER = ["--d-model", "32", "--head-dim", "16", "--d-state", "8", "--seq-len", "32"]  # after _TINY: later options win


def test_distill_outputs_that_cannot_be_made_are_one_line_errors_before_the_work(tmp_path, capsys, monkeypatch):
    """`distill train --out` / `distill data --out` that cannot be created (a missing parent that cannot
    be made, an existing file) gave FileNotFoundError / FileExistsError tracebacks; `distill ngram --out`
    in a directory it cannot write failed only after loading the target and indexing everything."""
    import engine.loading as loading

    data = _replies(tmp_path / "d", _ROWS)
    afile = tmp_path / "afile"
    afile.write_text("keep")

    def no_load(*a, **kw):
        raise AssertionError("the target loaded before --out was checked")

    monkeypatch.setattr(loading, "load", no_load)
    for cmd in (["train", "--data", data] + _TINY, ["data", "--n", "1"]):
        _one_line_error(capsys, ["distill", *cmd, "--out", "/proc/nope"], "/proc/nope: cannot create --out")
        _one_line_error(capsys, ["distill", *cmd, "--out", str(afile)], "--out exists and is not a directory")
    _one_line_error(capsys, ["distill", "ngram", "--data", data, "--out", "/proc/x.npz"], "/proc: cannot write into --out's directory")
    _one_line_error(capsys, ["distill", "ngram", "--data", data, "--out", str(afile / "x")], "exists and is not a directory")
    assert afile.read_text() == "keep" and not Path("/proc/x.npz").exists()


def test_distill_ngram_replaces_its_datastore_only_once_written(tmp_path, capsys, monkeypatch):
    """A failed write (disk full) left a truncated .npz where the previous datastore was."""
    import numpy as np

    data = _replies(tmp_path / "d", _ROWS)
    out = tmp_path / "ds.npz"
    out.write_bytes(b"the previous datastore")

    def full_disk(path, **kw):
        Path(path).write_bytes(b"PK half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full_disk)
    _one_line_error(capsys, ["distill", "ngram", "--data", data, "--out", str(out), "--target", "assets/mamba-drafter-smollm2",
                             "--min-count", "1"], "No space left on device")
    assert out.read_bytes() == b"the previous datastore" and sorted(p.name for p in tmp_path.iterdir()) == ["d", "ds.npz"]


def test_distill_train_checks_eval_data_before_training(tmp_path, capsys):
    """An --eval-data reply with a token id outside the vocabulary crashed (IndexError) after all the
    training steps, before the drafter was saved; a damaged one failed only then too."""
    data = _replies(tmp_path / "d", _ROWS)
    bad = _replies(tmp_path / "ev", _ROWS + [{"id": 9, "prompt_ids": [1], "response_ids": [99999999]}])
    out = tmp_path / "t"
    _one_line_error(capsys, ["distill", "train", "--data", data, "--out", str(out), "--eval-data", bad] + _TINY,
                    f"{bad}: token id 99999999 is outside")
    assert not (out / "train_state.pt").exists()  # refused before the first step
    (tmp_path / "xz").mkdir()
    (tmp_path / "xz" / "responses.jsonl.xz").write_bytes(b"not xz")
    _one_line_error(capsys, ["distill", "train", "--data", data, "--out", str(out), "--eval-data", str(tmp_path / "xz")] + _TINY,
                    "responses.jsonl.xz: cannot read the replies")
    assert not (out / "train_state.pt").exists()


def test_distill_topk_refuses_out_of_vocabulary_ids(tmp_path, capsys, smollm2_gguf_path):
    """`distill topk` on a reply id past the target's vocabulary: an IndexError traceback mid-run."""
    data = _replies(tmp_path / "d", _ROWS + [{"id": 9, "prompt_ids": [1], "response_ids": [99999999]}])
    _one_line_error(capsys, ["distill", "topk", "--data", data, "--k", "2"], "token id 99999999 is outside the target's vocabulary")
    assert not list((tmp_path / "d" / "topk2").iterdir())


def test_distill_export_never_writes_through_a_link_to_the_source_nor_leaves_a_half_export(tmp_path, capsys):
    """A --to whose model.safetensors is a link to the source's was written through (the source's
    weights rewritten); a damaged source left an empty --to behind and gave its own message instead
    of the loader's (the one `generate` shows)."""
    import shutil

    shipped, src = _drafter_copy(tmp_path)
    before = (src / "model.safetensors").read_bytes()
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    _one_line_error(capsys, ["distill", "export", "--from", str(src), "--to", str(dst), "--dtype", "bf16"], "a link")
    assert (src / "model.safetensors").read_bytes() == before
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy2(shipped / "config.json", bad / "config.json")
    (bad / "model.safetensors").write_bytes(before[:1000])
    _one_line_error(capsys, ["distill", "export", "--from", str(bad), "--to", str(tmp_path / "new"), "--dtype", "fp32"],
                    f"{bad / 'model.safetensors'}: corrupt or truncated safetensors file")
    assert not (tmp_path / "new").exists()


def test_distill_data_reads_damaged_prompt_and_reply_files_as_one_line_errors(tmp_path, capsys, monkeypatch):
    """`distill data --exclude DIR` with a damaged prompts.jsonl said only 'Expecting value: line 1
    column 1' (no file); a reply line that is JSON but not a record (`[1]`) was a TypeError traceback
    on resume (it is redone, as a line cut by a kill is)."""
    import engine.loading as loading
    import engine.session as session

    old = tmp_path / "old"
    old.mkdir()
    (old / "prompts.jsonl").write_text('{"id": "a", "text": "hi"}\ngarbage\n')
    _one_line_error(capsys, ["distill", "data", "--out", str(tmp_path / "new"), "--n", "2", "--exclude", str(old)],
                    f"{old / 'prompts.jsonl'}, line 2: not a prompt record")
    (old / "prompts.jsonl").write_text('{"id": "a", "text": "hi"}\n{"id": "b", "te')  # cut by a kill: fine
    from engine.distill import read_prompts

    assert [p["id"] for p in read_prompts(old / "prompts.jsonl")] == ["a"]

    class Loaded(Exception):
        pass

    def stop(*a, **kw):
        raise Loaded

    monkeypatch.setattr(session.ChatSession, "load", stop)
    monkeypatch.setattr(loading, "load", stop)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "responses.jsonl").write_text('[1]\n"x"\n{"id": ["p"]}\n')
    with pytest.raises(Loaded):  # read past the odd lines, on to loading the target
        main(["distill", "data", "--out", str(resumed), "--n", "2"])


def _drafter_copy(tmp_path: Path) -> tuple[Path, Path]:
    """(the shipped drafter's directory, a copy of its config and weights under tmp_path)."""
    import shutil

    shipped = Path(__file__).resolve().parents[1] / "assets" / "mamba-drafter-smollm2"
    src = tmp_path / "drafter"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(shipped / name, src / name)
    return shipped, src


@pytest.mark.parametrize("argv, says", [
    (["data", "--out", "X", "--threads", "-2"], "--threads must be >= 1, got -2"),
    (["data", "--out", "X", "--n", "-3"], "--n must be >= 1, got -3"),
    (["data", "--out", "X", "--batch", "0"], "--batch must be >= 1"),
    (["data", "--out", "X", "--device", "bogus"], "--device bogus: not a device"),
    (["topk", "--data", "X", "--k", "0"], "--k must be >= 1, got 0"),
    (["train", "--data", "X", "--out", "Y", "--seq-len", "0"], "--seq-len must be >= 2, got 0"),
    (["train", "--data", "X", "--out", "Y", "--batch", "0"], "--batch must be >= 1"),
    (["train", "--data", "X", "--out", "Y", "--lr", "nan"], "--lr must be >= 0, got nan"),
    (["train", "--data", "X", "--out", "Y", "--holdout", "1"], "--holdout must be at least 0 and below 1"),
    (["data", "--out", "X", "--limit", "-1"], "--limit must be >= 0"),
    (["train", "--data", "X", "--out", "Y", "--d-model", "16"], "--d-model 16 x 2 (the Mamba-2 inner width) must be a multiple of --head-dim 64"),
])
def test_distill_options_out_of_range_are_one_line_errors_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    """Counts and sizes below their least, a device torch does not know, a Mamba-2 shape that cannot
    be built: one line and exit 2, before anything is loaded or written."""
    monkeypatch.chdir(tmp_path)
    assert main(["distill", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written


def test_distill_on_cuda_without_cuda_is_one_line(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for sub in (["data", "--out", str(tmp_path / "d")], ["train", "--data", "X", "--out", str(tmp_path / "t")]):
        assert main(["distill", *sub, "--device", "cuda"]) == 2
        err = capsys.readouterr().err.strip()
        assert "--device cuda: no CUDA device here" in err and len(err.splitlines()) == 1


def test_distill_export_is_readable_by_others(tmp_path):
    """The exported weights take the umask's mode like the other files (safetensors writes 0600)."""
    import os

    data = tmp_path / "d"
    _tiny_replies(data)
    out, shipped = tmp_path / "t", tmp_path / "s"
    assert main(["distill", "train", "--data", str(data), "--out", str(out), *_TINY, *_TINIER, "--holdout", "0.25"]) == 0
    old = os.umask(0o022)
    try:
        assert main(["distill", "export", "--from", str(out), "--to", str(shipped)]) == 0
    finally:
        os.umask(old)
    assert (shipped / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (shipped / "config.json").stat().st_mode & 0o777 == 0o644


def test_grow_layers_starts_where_the_init_left_off_and_trains_deeper(tmp_path, capsys):
    """--grow-layers N deepens an --init drafter: the added layers are copies with a zeroed output
    projection, so before any update the grown drafter's logits are the init's exactly; it then
    saves N layers that the engine loads, and a resumed run keeps them."""
    import torch

    from engine.loading import load

    data = tmp_path / "d"
    _tiny_replies(data)
    first = tmp_path / "first"
    assert main(["distill", "train", "--data", str(data), "--out", str(first), *_TINY, "--holdout", "0.25"]) == 0
    grown = tmp_path / "grown"
    argv = ["distill", "train", "--data", str(data), "--out", str(grown), "--init", str(first), "--grow-layers", "3",
            *_TINY, "--lr", "0", "--holdout", "0.25", "--save-every", "1"]
    assert main(argv) == 0
    assert json.loads((grown / "config.json").read_text())["num_hidden_layers"] == 3
    a, b = load(str(first)).model, load(str(grown)).model
    ids = [1, 17, 300, 4000, 9, 9, 250]
    with torch.inference_mode():
        a.allocate(), b.allocate()
        ra, rb = a.verify(ids, list(range(-1, len(ids) - 1))), b.verify(ids, list(range(-1, len(ids) - 1)))
    assert torch.equal(ra, rb)
    assert main(argv[:-4] + ["--steps", "2", "--lr", "1e-3", "--holdout", "0.25", "--save-every", "1"]) == 0  # resumes
    assert torch.load(grown / "train_state.pt", weights_only=True)["step"] == 2
    assert json.loads((grown / "distill.json").read_text())["args"]["grow_layers"] == 3
    _one_line_error(capsys, ["distill", "train", "--data", str(data), "--out", str(tmp_path / "x"), *_TINY,
                             "--grow-layers", "3"], "--grow-layers deepens an --init drafter")


def test_export_shrink_vocab_keeps_the_drafter_exact_and_trains_on(tmp_path, capsys):
    """`distill export --shrink-vocab DATA` stores embedding rows only for the draft vocabulary,
    the special tokens and the tokens DATA holds twice or more, plus one shared row; the engine
    widens it back (every stored token's row bit-identical, the rest the shared row), the draft
    vocabulary is unchanged, and `distill train --init` continues from it at full width."""
    import torch
    from safetensors.torch import load_file

    from engine.loading import load

    data = tmp_path / "d"
    _tiny_replies(data)
    src = tmp_path / "src"
    assert main(["distill", "train", "--data", str(data), "--out", str(src), *_TINY, "--holdout", "0.25",
                 "--vocab-min-count", "1"]) == 0
    small = tmp_path / "small"
    assert main(["distill", "export", "--from", str(src), "--to", str(small), "--dtype", "fp32",
                 "--shrink-vocab", str(data)]) == 0
    assert "embedding rows:" in capsys.readouterr().err
    dv = json.loads((small / "draft_vocab.json").read_text())
    rows = dv["row_ids"]
    cfg = json.loads((small / "config.json").read_text())
    assert rows[-1] == -1 and cfg["vocab_size"] == len(rows) and dv["vocab_size"] == 49152
    from engine.distill_train import load_sequences

    counts = {}
    for ids, _ in load_sequences(data):
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
    assert {t for t, c in counts.items() if c >= 2} <= set(rows) and set(dv["token_ids"]) <= set(rows)
    assert 1 in rows and 2 in rows  # the tokenizer's special tokens (<|im_start|>, <|im_end|>)
    assert load_file(str(small / "model.safetensors"))["backbone.embeddings.weight"].shape[0] == len(rows)
    full, cut = load(str(src)).model, load(str(small)).model
    assert cut.vocab_size == full.vocab_size == 49152 and torch.equal(cut.draft_vocab, full.draft_vocab)
    assert torch.equal(cut.embed[rows[:-1]], full.embed[rows[:-1]])
    other = sorted(set(range(49152)) - set(rows))
    assert torch.allclose(cut.embed[other[0]], full.embed[other].mean(0), atol=1e-6)
    ids = sorted(set(rows[:-1]))[:6]
    with torch.inference_mode():
        full.allocate(), cut.allocate()
        pos = list(range(-1, len(ids) - 1))
        # every stored token's logit is exact (the draft vocabulary's among them); the others all score the shared row
        assert torch.equal(full.verify(ids, pos)[:, rows[:-1]], cut.verify(ids, pos)[:, rows[:-1]])
    again = tmp_path / "again"
    assert main(["distill", "train", "--data", str(data), "--out", str(again), "--init", str(small), *_TINY,
                 "--lr", "0", "--holdout", "0.25"]) == 0
    w = load_file(str(again / "model.safetensors"))["backbone.embeddings.weight"]
    assert w.shape[0] == 49152 and torch.equal(w, cut.embed.float())
    _one_line_error(capsys, ["distill", "export", "--from", str(small), "--to", str(tmp_path / "twice"), "--shrink-vocab",
                             str(data)], "row-reduced already")
    bad = dict(dv, row_ids=rows[:-2] + [-1])  # one row short of the weights
    (small / "draft_vocab.json").write_text(json.dumps(bad))
    _one_line_error(capsys, ["generate", "--target", str(small), "--prompt-ids", "1,2", "--max-new-tokens", "2"],
                    "row_ids must name each of the config's")
    (small / "draft_vocab.json").write_text(json.dumps(dict(dv, token_ids=dv["token_ids"] + [other[0]])))
    _one_line_error(capsys, ["generate", "--target", str(small), "--prompt-ids", "1,2", "--max-new-tokens", "2"],
                    "every draft token must have an embedding row")


def test_export_head_top_keeps_the_most_frequent_reply_tokens_and_the_drafter_loads(tmp_path, capsys):
    """`distill export --head-top N --head-data DATA`: draft_vocab.json cut to the N draft tokens
    most frequent in DATA's replies (ties: the lower id) plus the end-of-sequence token; the same
    weights; the drafter proposes only those (its output layer has N columns), and with
    --shrink-vocab the row map stays."""
    import collections

    import torch

    from engine.distill_train import load_sequences
    from engine.drafters.model import ModelDrafter
    from engine.loading import load

    data = tmp_path / "d"
    _tiny_replies(data)
    src = tmp_path / "src"
    assert main(["distill", "train", "--data", str(data), "--out", str(src), *_TINY, "--holdout", "0.25",
                 "--vocab-min-count", "1"]) == 0
    have = json.loads((src / "draft_vocab.json").read_text())["token_ids"]
    counts = collections.Counter(t for ids, start in load_sequences(data) for t in ids[start:])
    n = 2
    eos = json.loads((src / "config.json").read_text())["eos_token_id"]
    want = sorted(set(sorted(have, key=lambda t: (-counts[t], t))[:n]) | ({eos} & set(have)))
    assert len(want) >= n and len(have) > len(want)
    top = tmp_path / "top"
    assert main(["distill", "export", "--from", str(src), "--to", str(top), "--dtype", "fp32", "--head-top", str(n),
                 "--head-data", str(data)]) == 0
    assert "draft vocabulary: " in capsys.readouterr().err
    assert json.loads((top / "draft_vocab.json").read_text())["token_ids"] == want
    full, cut = load(str(src)).model, load(str(top)).model
    assert torch.equal(cut.embed, full.embed) and cut.draft_vocab.tolist() == want
    d = ModelDrafter(cut, 49152, draft_vocab=cut.draft_vocab)
    assert d.model.lm_head_t.shape[1] == len(want)  # the head computes only the kept columns
    # with a row-reduced embedding too: the row map is kept beside the cut list
    both = tmp_path / "both"
    assert main(["distill", "export", "--from", str(src), "--to", str(both), "--dtype", "fp32", "--shrink-vocab", str(data),
                 "--head-top", str(n), "--head-data", str(data)]) == 0
    dv = json.loads((both / "draft_vocab.json").read_text())
    assert dv["token_ids"] == want and dv["row_ids"][-1] == -1 and dv["vocab_size"] == 49152
    assert load(str(both)).model.draft_vocab.tolist() == want
    _one_line_error(capsys, ["distill", "export", "--from", str(src), "--to", str(tmp_path / "x"), "--head-top", "2"],
                    "go together")


def test_training_keeps_freed_memory_on_glibc():
    """`distill train` on a CPU keeps glibc from unmapping each step's freed logits (mallopt)."""
    import platform
    import sys

    from engine.distill_train import keep_freed_memory

    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert keep_freed_memory() is True
    else:
        assert keep_freed_memory() in (True, False)


def test_sigterm_stops_a_training_run_as_ctrl_c_does(tmp_path):
    """A run started in the background ignores SIGINT (nohup ... &); SIGTERM saves the state and
    exits 130 like Ctrl-C, and the run resumes from it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "d"
    _tiny_replies(data)
    out = tmp_path / "t"
    cmd = [sys.executable, "-m", "engine.cli", "distill", "train", "--data", str(data), "--out", str(out), *_TINY, *_TINIER,
           "--steps", "100000", "--lr", "1e-3", "--holdout", "0.25", "--save-every", "1", "--threads", "1"]
    p = subprocess.Popen(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        t0 = time.monotonic()
        while not (out / "train_state.pt").exists() and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.2)
        assert p.poll() is None, p.communicate()[1][-2000:]
        os.kill(p.pid, signal.SIGINT)  # ignored, as under nohup ... &
        time.sleep(0.5)
        assert p.poll() is None
        os.kill(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert "interrupted at step" in err
    step = int(torch.load(out / "train_state.pt", weights_only=True)["step"])
    assert step >= 1
