"""Builders shared by the test suites: a Strands agent on a ``TitoModel``, and the same on the scripted backend.

Plain functions (not fixtures), so that helpers modules and Ray workers can call them too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import ConversationManager, NullConversationManager

from tito_core import TitoModel
from tito_testing.scripted import ScriptedBackend

__all__ = ["add", "agent_for", "echo", "hermes_call", "scripted_agent"]


def hermes_call(name: str, arguments: dict[str, Any], *, compact: bool = False) -> str:
    """The Hermes tool call (Qwen's format) a model emits for ``name(**arguments)``."""
    sep = (",", ":") if compact else (", ", ": ")
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=sep)
    return f"<tool_call>\n{body}\n</tool_call>"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def agent_for(
    model: Any,
    tools: Sequence[Any] = (),
    *,
    system_prompt: str | None = None,
    manager: ConversationManager | None = None,
    hooks: Sequence[Any] | None = None,
) -> Agent:
    """A quiet Strands agent on ``model`` (no callback handler); its history is never rewritten unless
    ``manager`` says otherwise (default: ``NullConversationManager``)."""
    return Agent(
        model=model,
        tools=list(tools),
        system_prompt=system_prompt,
        callback_handler=None,
        conversation_manager=manager or NullConversationManager(),
        hooks=list(hooks or []),
    )


def scripted_agent(
    tokenizer: Any,
    replies: Any,
    tools: Sequence[Any] = (),
    *,
    system_prompt: str | None = None,
    manager: ConversationManager | None = None,
    hooks: Sequence[Any] | None = None,
    backend: ScriptedBackend | None = None,
    **model_kwargs: Any,
) -> tuple[Agent, TitoModel, ScriptedBackend]:
    """An agent on a ``TitoModel`` over a scripted backend answering ``replies`` (or over ``backend``, a scripted
    backend built by the caller); ``context_length`` goes to the backend, every other keyword to the model."""
    context_length = model_kwargs.pop("context_length", None)
    backend = backend or ScriptedBackend(tokenizer, replies, context_length=context_length)
    model = TitoModel(backend, tokenizer, **model_kwargs)
    return agent_for(model, tools, system_prompt=system_prompt, manager=manager, hooks=hooks), model, backend
