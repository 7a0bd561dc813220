"""engine/ never imports textual (DESIGN.md); app/ never imports torch (tests/app covers that)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import engine


def test_engine_never_imports_textual():
    mods = [m.name for m in pkgutil.walk_packages(engine.__path__, "engine.")]
    assert {"engine.models.llama", "engine.drafters.model", "engine.generate", "engine.cli"} <= set(mods)
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in mods) + \
        "print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
