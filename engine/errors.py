"""Errors the engine shows to users as they are: ``str(err)`` is one line naming the file and what
is wrong, so callers print it instead of a traceback."""

from __future__ import annotations

import os


class SpecchatError(Exception):
    """Base of the user-facing errors. The message is collapsed onto one line.

    Pass the file either inside the message or as ``path=`` (then it is put in front):

        raise ModelLoadError("tensor data ends early (file truncated?)", path=gguf_path)
        raise ConfigError(f"{toml_path}: unknown key 'hub'")
    """

    def __init__(self, problem: str, *, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause's text held
        super().__init__(self.problem if self.path is None else f"{self.path}: {self.problem}")


class ModelLoadError(SpecchatError):
    """A checkpoint or tokenizer could not be loaded (missing, corrupt, or of an unsupported kind)."""


class ContextOverflowError(SpecchatError):
    """The prompt does not fit the model's context window (engine/generate.py; the app reads it as a
    reply ended by the context, not as a failure)."""


class ConfigError(SpecchatError):
    """A human-written config file (models.toml) is invalid."""
