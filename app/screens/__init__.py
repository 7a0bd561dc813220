"""Screens of the app (one module each)."""

from .chat import ChatScreen
from .help import HelpScreen
from .models import ModelChoice, ModelsScreen

__all__ = ["ChatScreen", "HelpScreen", "ModelChoice", "ModelsScreen"]
