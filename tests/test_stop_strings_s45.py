"""Session 45: `generate --stop TEXT` (Decoder.steps(stop_strings=...)): the reply ends with the token
that completes a stop string, whatever the strategy: a step's accepted drafts after it are dropped
(and the target's cache rolled back to it), so every strategy's greedy reply equals plain greedy
decoding's, cut at the same token. Oracle: plain greedy decoding without the stop, cut by hand."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import from_spec, preset
from engine.tokenizer import StreamDecoder

from .lossless_util import near_drafter
from .test_cli_review_s42 import no_loading, one_error  # noqa: F401 - no_loading is a fixture
from .tiny import saved
from .vocab_pairs import trained_bpe

ALPHA = "abcdefghijklmnopqrstuvwxyz .,"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("stops"))
    tok = trained_bpe(96, alphabet=ALPHA)
    target = load(str(saved("llama", root))).model
    drafter = load(str(near_drafter("llama", root))).model
    dec = Decoder(target, drafter, detokenize=lambda: StreamDecoder(tok))
    prompt = tok.encode("the cat sat on the mat. the cat sat on the")
    return dec, tok, prompt


def _reply(dec, prompt, s, n=40, stops=()):
    dec.reset()
    evs, summ = run_generation(dec, prompt, s, n, stop_strings=stops)
    return [t for e in evs for t in e.emitted], "".join(e.text for e in evs), evs[-1].finish_reason, dec


def _stop_in(tok, full):
    """A stop string from the middle of plain decoding's reply, and the tokens up to its end."""
    for k in range(6, len(full)):
        text = tok.decode(full[:k])
        prev = tok.decode(full[:k - 1])
        stop = text[len(prev) - 1:]  # the last token's text and the character before it
        if len(stop) >= 2 and stop not in prev:
            return stop, full[:k]
    raise AssertionError("no stop string found")


@pytest.mark.parametrize("spec", ["ar", "pld", "sd", "tree", "mab", "optimal", "hybrid", "sd:auto", "pld:auto"])
def test_every_strategy_stops_at_the_same_token(setup, spec):
    dec, tok, prompt = setup
    full, _, _, _ = _reply(dec, prompt, preset("ar"))
    stop, want = _stop_in(tok, full)
    got, text, reason, d = _reply(dec, prompt, from_spec(spec), stops=[stop])
    assert got == want and reason == "stop_string"
    assert text.endswith(stop) or stop in text[-len(stop) - 8:]
    assert d.target.cache.length == len(d.history) - 1  # the drafts after the stop are not kept


def test_a_stop_beyond_the_limit_ends_on_length_and_a_missing_one_changes_nothing(setup):
    dec, tok, prompt = setup
    full, _, _, _ = _reply(dec, prompt, preset("ar"))
    stop, want = _stop_in(tok, full)
    got, _, reason, _ = _reply(dec, prompt, preset("sd"), n=len(want) - 1, stops=[stop])
    assert got == full[:len(want) - 1] and reason == "length"
    got, _, reason, _ = _reply(dec, prompt, preset("pld"), stops=["qqqqzzzz"])
    assert got == full and reason == "length"


def test_cli(tmp_path, capsys, no_loading):  # noqa: F811
    assert "--stop is empty" in one_error(capsys, "generate", "--stop", "", "hi")


def test_cli_without_a_tokenizer_is_one_line(tmp_path_factory, capsys):
    target = saved("llama", str(tmp_path_factory.getbasetemp() / "stops-cli"))
    capsys.readouterr()  # (transformers' progress lines of saving it)
    code = main(["generate", "--target", str(target), "--prompt-ids", "1,2,3", "--stop", "x", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("specchat: error: --stop needs the model's tokenizer") and len(err.splitlines()) == 1


def test_cli_stops_smollm2(smollm2_gguf_path, capsys):
    """The shipped tokenizer and a real reply: the text ends at the stop string's token."""
    args = ["generate", "--target", str(smollm2_gguf_path), "--drafter", "none", "--strategy", "pld",
            "--max-new-tokens", "48", "--json", "Count from one to twenty, in words, separated by commas."]
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    words = full["text"].split()
    assert len(words) > 8
    stop = words[len(words) // 2]
    assert main(args + ["--stop", stop]) == 0
    cut = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cut["finish_reason"] == "stop_string" and stop in cut["text"]
    assert full["token_ids"][:len(cut["token_ids"])] == cut["token_ids"] and len(cut["token_ids"]) < len(full["token_ids"])


def test_a_stop_of_invalid_utf8_is_said_and_kept_as_the_reply_would_show_it(tmp_path_factory, capsys, monkeypatch):
    import argparse

    from engine.cli import _stops

    args = argparse.Namespace(stop=["ok\udcff", "fine"])  # (a shell's invalid byte, as Python's argv holds it)
    assert _stops(args) == ["ok\ufffd", "fine"]
    assert "--stop is not valid UTF-8: 1 byte(s) replaced by U+FFFD" in capsys.readouterr().err
    assert _stops(args) == ["ok\ufffd", "fine"] and capsys.readouterr().err == ""  # said once
