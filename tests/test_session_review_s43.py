"""Session 43: a drafter the user named that cannot be loaded says it was the drafter (the app's
toast read "Could not load the model: trunc/model.safetensors: ...", as if the target had failed)."""

from __future__ import annotations

import shutil

import pytest

from engine.errors import SpecchatError
from engine.session import ChatSession

from .tiny import saved


def test_a_named_drafter_that_cannot_load_says_it_is_the_drafter(tmp_path):
    target, drafter = saved("llama", str(tmp_path)), saved("draft", str(tmp_path))
    broken = tmp_path / "trunc"
    shutil.copytree(drafter, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(SpecchatError) as info:
        ChatSession.load(target=str(target), drafter=str(broken), dtype="fp32")
    msg = str(info.value)
    assert msg.startswith(f"the drafter {str(broken)!r} could not be loaded: ") and "model.safetensors" in msg, msg
    assert "\n" not in msg
