"""The app shortens Python's GIL switch interval while it runs (app/main.py GIL_SWITCH_S) and puts
the interpreter's back when it ends."""

from __future__ import annotations

import sys

import pytest

from app import main as app_main

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, ready


async def test_the_app_runs_with_a_short_gil_switch_interval_and_restores_it() -> None:
    before = sys.getswitchinterval()
    app = make_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        # the interpreter keeps the interval in microseconds: 0.0001 s reads back as 9.999999999999999e-05
        assert sys.getswitchinterval() == pytest.approx(app_main.GIL_SWITCH_S, abs=1e-6) and app_main.GIL_SWITCH_S < before
    assert sys.getswitchinterval() == before
