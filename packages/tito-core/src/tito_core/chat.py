"""Deprecated home of the chat helpers, kept so that existing imports work.

The conversion of Strands messages moved to :mod:`tito_core.strands_messages` (the Strands front), the core's
message form to :mod:`tito_core.conversation`, and the chat-template renderer to :mod:`tito_core.render`.
"""

from __future__ import annotations

from .conversation import ChatMessage as ChatMessage
from .conversation import tool_specs_to_chat as tool_specs_to_chat
from .render.codec import OFFLOAD_CHARS as OFFLOAD_CHARS
from .render.codec import OFFLOAD_TOKENS as OFFLOAD_TOKENS
from .render.renderer import ChatRenderer as ChatRenderer
from .render.renderer import first_difference as first_difference
from .render.shared import shared_renderer as shared_renderer
from .strands_messages import TEXT_JOINER as TEXT_JOINER
from .strands_messages import system_text as system_text
from .strands_messages import to_chat_messages as to_chat_messages
