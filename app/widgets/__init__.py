"""Small reusable widgets of the chat UI."""

from .chat_message import ChatMessage, MessageList
from .dashboard import Dashboard
from .draft_tree import DraftTreeView
from .prompt import PromptInput
from .status import StatusLine, StatusState
from .step_view import StepView

__all__ = [
    "ChatMessage", "Dashboard", "DraftTreeView", "MessageList", "PromptInput", "StatusLine", "StatusState",
    "StepView",
]
