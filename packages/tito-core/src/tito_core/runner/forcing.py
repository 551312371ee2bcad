"""Forced first tool calls: a Strands hook provider that makes the first model calls of a rollout call a tool.

Small models rarely call tools on their own, so an RL run on them sees few tool calls to learn from.
With ``rollout.forced_tool_calls = N`` the first ``N`` model calls of each rollout are constrained to one
tool call (``tool_choice="any"``, applied by the engine's constrained decoding: the backend must support
grammars); later calls go back to the configured ``tool_choice``. Forced turns are recorded like any
other, with ``Turn.constrained`` set: their logprobs are post-constraint (docs/tool-choice.md).
"""

from __future__ import annotations

from typing import Any

from strands.hooks import AfterModelCallEvent, BeforeModelCallEvent, HookProvider, HookRegistry

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
        """Force ``tool_choice`` for the model calls that need it, and restore it right after each."""
        registry.add_callback(BeforeModelCallEvent, self._before_model)
        registry.add_callback(AfterModelCallEvent, self._after_model)

    def _before_model(self, event: BeforeModelCallEvent) -> None:
        if self.calls < self.count:
            event.agent.model.update_config(tool_choice="any")
        self.calls += 1

    def _after_model(self, event: AfterModelCallEvent) -> None:
        # Restored after every forced call, not before the next one: a model call that no hook sees (the
        # summarizing conversation manager asks the model for a summary directly, without tools) must not inherit it.
        if self.calls <= self.count:
            event.agent.model.update_config(tool_choice=self.after)
