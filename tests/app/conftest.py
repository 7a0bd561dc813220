"""Fixtures for every UI test. Sections below are owned by the tests that use them; append new ones."""

from __future__ import annotations

from pathlib import Path

import pytest


# ---------------------------------------------------------------------------------------------
# Chats and settings (app.store): never the real user data directory
# ---------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty SPECCHAT_DATA_DIR (the app's chat database lives there)."""
    path = tmp_path / "specchat-data"
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    return path
