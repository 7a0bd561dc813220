"""Session 45: `specchat chat` takes the sampling flags (--temperature, --top-p, --top-k, --min-p,
--repeat-penalty, --repeat-last-n, --seed): set over the first model's strategy, whichever it is
(--strategy's, the saved one, the default); a combination the strategy refuses is a notice."""

from __future__ import annotations

from pathlib import Path

from app.screens.chat import SETTING_STRATEGY
from app.store import DB_NAME, ChatStore
from engine.strategy import preset

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, notices, ready, status


async def test_flags_set_over_the_default_strategy() -> None:
    engine = FakeEngine(strategy=preset("pld"))
    app = make_app(engine, initial_sampling={"temperature": 0.7, "top_k": 40, "repeat_penalty": 1.1})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        s = engine.strategy
        assert (s.name, s.temperature, s.top_k, s.repeat_penalty) == ("pld", 0.7, 40, 1.1)
        assert "top-k=40" in status(app)


async def test_flags_set_over_the_saved_and_the_command_lines_strategy(data_dir: Path) -> None:
    store = ChatStore.open(data_dir / DB_NAME)
    store.set_setting(SETTING_STRATEGY, preset("tree").to_dict())
    store.close()
    engine = FakeEngine()
    app = make_app(engine, initial_sampling={"temperature": 1.0, "min_p": 0.05})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (engine.strategy.name, engine.strategy.temperature, engine.strategy.min_p) == ("tree", 1.0, 0.05)
    engine = FakeEngine()
    app = make_app(engine, initial_strategy=preset("sd"), initial_sampling={"temperature": 0.5})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert (engine.strategy.name, engine.strategy.temperature) == ("sd", 0.5)


async def test_a_combination_the_strategy_refuses_is_a_notice() -> None:
    engine = FakeEngine()
    app = make_app(engine, initial_strategy=preset("sd", verify="greedy"), initial_sampling={"temperature": 0.7})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert engine.strategy.temperature == 0.0 and engine.strategy.name == "sd"
        assert any(m.startswith("Sampling flags not used: --verify greedy needs temperature 0") for m, _ in notices(app))


def test_the_cli_passes_the_flags_given_and_refuses_bad_ones(monkeypatch, capsys, tmp_path) -> None:
    import app.main
    from engine.cli import main

    got = {}
    monkeypatch.setattr(app.main, "run_app", lambda *a, **k: got.update(k))
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path))
    assert main(["chat", "--temperature", "0.7", "--top-k", "40", "--repeat-penalty", "1.1", "--seed", "3"]) == 0
    assert got["initial_sampling"] == {"temperature": 0.7, "top_k": 40, "repeat_penalty": 1.1, "seed": 3}
    got.clear()
    assert main(["chat"]) == 0 and got["initial_sampling"] == {}  # unset: the strategy's own
    for argv, says in ((["--top-k", "-1"], "top-k must be"), (["--min-p", "nan"], "--min-p must be a finite number"),
                       (["--temperature", "1e-9"], "too small"), (["--repeat-last-n", "0"], "repeat-last-n"),
                       (["--seed", str(1 << 70)], "--seed must be between")):
        got.clear()
        assert main(["chat", *argv]) == 2 and not got  # refused before the app starts
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and err.startswith("specchat: error: ")
