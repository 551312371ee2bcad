"""Chat messages to token ids: the chat-template renderer, its tokenizer shortcuts, and the shared renderers.

- ``tito_core.render.renderer``: :class:`~tito_core.render.renderer.ChatRenderer`, whole and incremental
  renders with a chat template.
- ``tito_core.render.codec``: the Rust shortcut of a fast tokenizer and the worker threads for long texts.
- ``tito_core.render.escape``: ``escape_special_text`` (control-token text in contents stays text).
- ``tito_core.render.shared``: :func:`shared_renderer`, the renderer a tokenizer gets (Mistral's included),
  one per tokenizer and settings in a process.

Nothing here imports Strands: the renderers take the core's chat messages.
"""

from __future__ import annotations

from tito_core.render.renderer import ChatMessage, ChatRenderer
from tito_core.render.shared import shared_renderer

__all__ = ["ChatMessage", "ChatRenderer", "shared_renderer"]
