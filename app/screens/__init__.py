"""Screens of the app (one module each)."""

from .chat import ChatScreen
from .help import HelpScreen
from .models import ModelChoice, ModelsScreen
from .system_prompt import SystemPromptScreen

__all__ = ["ChatScreen", "HelpScreen", "ModelChoice", "ModelsScreen", "SystemPromptScreen"]
