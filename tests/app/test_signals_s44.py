"""Session 44: SIGINT / SIGTERM to the app. SIGINT (``kill -INT``; Ctrl-C reaching the process
from outside its raw terminal) left silently with status 0, and SIGTERM killed the process where it
stood (a reply in flight never saved). Both now quit as Ctrl+Q does and the CLI says so, exiting
130 / 143."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
from pathlib import Path

import pytest

from app.store import DB_NAME

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, ready, send
from .test_chat import wait_for


def saved(data_dir: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(data_dir / DB_NAME)
    try:
        return db.execute("SELECT role, content FROM messages ORDER BY chat_id, idx").fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_a_signal_mid_reply_quits_as_ctrl_q_and_keeps_the_reply(data_dir: Path, sig, code) -> None:
    gate = threading.Semaphore(0)
    engine = FakeEngine(["first ", "part ", "never"], gate=gate, step_delay_s=0.0)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        handlers = getattr(asyncio.get_running_loop(), "_signal_handlers", None)
        if handlers is not None:  # (the unix loop's table: the app took both signals)
            assert signal.SIGINT in handlers and signal.SIGTERM in handlers
        await send(pilot, "hello")
        gate.release(2)
        await wait_for(pilot, lambda: app.chat.busy and "part" in (app.chat._run.text if app.chat._run else ""))
        app._on_signal(sig)  # what the loop's handler calls
        await pilot.pause()
    assert app.interrupted_by == signal.Signals(sig).name
    assert app.return_code == code
    rows = saved(data_dir)
    assert rows[0] == ("user", "hello") and rows[-1] == ("assistant", "first part ")
    handlers = getattr(asyncio.get_running_loop(), "_signal_handlers", None)
    if handlers is not None:  # given back at exit: the test process's own Ctrl-C works again
        assert signal.SIGINT not in handlers and signal.SIGTERM not in handlers


def test_the_cli_says_it_was_interrupted_and_exits_with_the_signals_status(monkeypatch, capsys, tmp_path) -> None:
    import app.main
    from engine.cli import main

    monkeypatch.setattr(app.main, "run_app", lambda *a, **k: "SIGINT")
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path))
    assert main(["chat"]) == 130
    assert "interrupted by SIGINT" in capsys.readouterr().err
    monkeypatch.setattr(app.main, "run_app", lambda *a, **k: None)
    assert main(["chat"]) == 0
