"""The loop limiter: a Strands hook provider that ends a rollout after too many model calls, tool calls or messages.

A model call over the limit (or one with too many messages) is refused before it reaches the model by
raising :class:`~tito_core.errors.LoopLimitError`, which ends the agent's loop; the runner then closes the
rollout ``truncated`` with the reason. A tool call over the limit is cancelled (the model never sees its
result: the next model call is refused with the same reason). Strands logs every exception that ends its loop as
an error; the limiter's is not one (the record says why the rollout ended), so that line is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from strands.hooks import BeforeModelCallEvent, BeforeToolCallEvent, HookProvider, HookRegistry

from ..errors import LoopLimitError

__all__ = ["LoopLimiter"]

_EVENT_LOOP_LOG = logging.getLogger("strands.event_loop.event_loop")


def _not_a_loop_limit(record: logging.LogRecord) -> bool:
    """Drop Strands' "exception=<LoopLimitError> | event loop cycle failed": the limiter ended the loop."""
    return not (isinstance(record.args, tuple) and record.args[:1] == (LoopLimitError.__name__,))


class LoopLimiter(HookProvider):
    """Count one agent's model and tool calls; None means no limit.

    Attributes:
        model_calls: Model calls started so far.
        tool_calls: Tool calls started so far (refused ones included).
        tripped: The reason of the first limit reached, or None.
    """

    def __init__(
        self, *, max_model_calls: int | None = None, max_tool_calls: int | None = None, max_messages: int | None = None
    ) -> None:
        self.max_model_calls = max_model_calls
        self.max_tool_calls = max_tool_calls
        self.max_messages = max_messages
        self.model_calls = 0
        self.tool_calls = 0
        self.tripped: str | None = None

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Count before every model call and tool call."""
        _EVENT_LOOP_LOG.addFilter(_not_a_loop_limit)  # once: a filter already there is not added again
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)

    def _trip(self, reason: str) -> str:
        if self.tripped is None:
            self.tripped = reason
        return self.tripped

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        if self.tripped is None and self.max_model_calls is not None and self.model_calls >= self.max_model_calls:
            self._trip(f"loop limit: max_model_calls={self.max_model_calls} reached")
        messages = len(event.agent.messages)
        if self.tripped is None and self.max_messages is not None and messages > self.max_messages:
            self._trip(f"loop limit: {messages} messages exceed max_messages={self.max_messages}")
        if self.tripped is not None:
            raise LoopLimitError(self.tripped)
        self.model_calls += 1

    def _before_tool(self, event: BeforeToolCallEvent) -> None:
        self.tool_calls += 1
        if self.max_tool_calls is not None and self.tool_calls > self.max_tool_calls:
            event.cancel_tool = self._trip(f"loop limit: max_tool_calls={self.max_tool_calls} reached")
