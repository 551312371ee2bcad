"""Deprecated home of the rollout core, kept so that existing imports work: use :mod:`tito_core.rollout_core`.

:class:`Rollout` here is :class:`tito_core.rollout_core.Rollout` whose :meth:`~Rollout.call` also takes Strands'
``(messages, tool_specs, system_prompt, options)``, converted with
:func:`tito_core.strands_messages.to_conversation`; :func:`exit_status` is :func:`tito_core.status.status_of`
for an exception.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from strands.types.content import Messages
from strands.types.tools import ToolSpec

from . import rollout_core as _core
from .conversation import Conversation
from .rollout_core import CallOptions, CallResult, PrefixPolicy, RenderMode, check_result
from .status import Status, status_of
from .strands_messages import to_conversation

__all__ = ["CallOptions", "CallResult", "PrefixPolicy", "RenderMode", "Rollout", "check_result", "exit_status"]


def exit_status(exc: BaseException) -> tuple[Status, str]:
    """The status (and reason) a trajectory takes when ``exc`` ends a model call."""
    status, reason = status_of(exc)
    return status, reason or ""


class Rollout(_core.Rollout):
    """:class:`tito_core.rollout_core.Rollout` that also takes Strands messages (deprecated: pass a Conversation)."""

    async def call(  # type: ignore[override]
        self,
        messages: Messages | Conversation,
        tool_specs: Sequence[ToolSpec] | CallOptions | None = None,
        system_prompt: str | None = None,
        options: CallOptions | None = None,
        *,
        system_prompt_content: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
    ) -> CallResult:
        """``call(conversation, options)``; deprecated: ``call(messages, tool_specs, system, options)`` (Strands)."""
        if isinstance(messages, Conversation):
            if not isinstance(tool_specs, CallOptions):
                raise TypeError("Rollout.call(conversation, options): options must be CallOptions")
            return await super().call(messages, tool_specs, tool_choice=tool_choice)
        warnings.warn(
            "Rollout.call(messages, tool_specs, system_prompt, options) with Strands messages is deprecated: use "
            "tito_core.rollout_core.Rollout.call(tito_core.strands_messages.to_conversation(...), options)",
            DeprecationWarning,
            stacklevel=2,
        )
        if options is None or isinstance(tool_specs, CallOptions):
            raise TypeError("Rollout.call(messages, tool_specs, system_prompt, options): options must be CallOptions")
        conversation = to_conversation(messages, tool_specs, system_prompt, system_prompt_content)
        return await super().call(conversation, options, tool_choice=tool_choice)
