"""Small reusable widgets of the chat UI."""

from .chat_message import ChatMessage, MessageList
from .prompt import PromptInput
from .status import StatusLine, StatusState

__all__ = ["ChatMessage", "MessageList", "PromptInput", "StatusLine", "StatusState"]
