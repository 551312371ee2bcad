"""Forced first tool calls: a Strands hook provider that makes the first model calls of a rollout call a tool.

Small models rarely call tools on their own, so an RL run on them sees few tool calls to learn from.
With ``rollout.forced_tool_calls = N`` the first ``N`` model calls of each rollout are constrained to one
tool call (``tool_choice="any"``, applied by the engine's constrained decoding: the backend must support
grammars); later calls go back to the configured ``tool_choice``. Forced turns are recorded like any
other, with ``Turn.constrained`` set: their logprobs are post-constraint (docs/tool-choice.md).
"""

from __future__ import annotations

from typing import Any

from strands.hooks import BeforeModelCallEvent, HookProvider, HookRegistry

__all__ = ["ForcedToolCalls"]


class ForcedToolCalls(HookProvider):
    """Force a tool call on the first ``count`` model calls of one agent, then restore ``after``.

    Args:
        count: How many model calls to force (0: none).
        after: The ``tool_choice`` of the calls after them (the config's; None = auto).
    """

    def __init__(self, count: int, after: str | dict[str, Any] | None = None) -> None:
        self.count = count
        self.after = after
        self.calls = 0

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        """Switch ``tool_choice`` before the model calls that need it."""
        registry.add_callback(BeforeModelCallEvent, self._before_model)

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        model = event.agent.model
        if self.calls < self.count:
            model.update_config(tool_choice="any")
        elif self.calls == self.count and self.count:
            model.update_config(tool_choice=self.after)
        self.calls += 1
