"""Screens of the app (one module each)."""

from .chat import ChatScreen
from .help import HelpScreen

__all__ = ["ChatScreen", "HelpScreen"]
