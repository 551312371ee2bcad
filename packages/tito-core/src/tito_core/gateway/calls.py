"""One chat-completions call on a claimed gateway rollout: the request checked, run on the core, answered.

Every front ends here: the Responses and Messages APIs map their requests onto this one
(:mod:`~tito_core.gateway.openai_responses`, :mod:`~tito_core.gateway.anthropic_messages`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from ..conversation import Conversation, tool_specs_to_chat
from ..errors import BackendConnectionError
from ..render import ChatRenderer
from ..rollout_core import CallOptions
from .completion import completion, message_of
from .errors import GatewayError, error_of
from .openai_chat import ChatRequest, parse_request
from .registry import GatewayRollout

__all__ = ["chat_call", "count_tokens", "placed_system", "translated"]

logger = logging.getLogger("tito")
T = TypeVar("T")


async def chat_call(
    rollout: GatewayRollout, body: Any, options: CallOptions, model_name: str
) -> tuple[dict[str, Any], ChatRequest]:
    """Answer a chat-completions ``body`` on ``rollout`` (claimed by the caller) with the model's ``options``.

    Returns the ChatCompletion body and the checked request.

    Raises:
        GatewayError: 400 (a field tito cannot honour, named), or the error a failed model call maps to
            (:func:`~tito_core.gateway.errors.error_of`); the rollout has its status.
    """
    core = rollout.rollout
    try:
        request = parse_request(body, rollout.replies, options.sampling, rollout.images)
    except GatewayError as exc:
        core.fail(exc)
        raise
    conversation = placed_system(request.conversation, core.renderer, rollout.id)
    call_options = msgspec.structs.replace(options, sampling=request.sampling)
    try:
        result = await rollout.run_call(
            core.call(
                conversation,
                call_options,
                tool_choice=request.tool_choice,
                answer_schema=request.answer_schema,
            )
        )
    except Exception as exc:  # the rollout has its status; the client gets OpenAI's error JSON
        rollout.lost_engine |= isinstance(exc, BackendConnectionError)
        raise error_of(exc) from exc
    message = message_of(result)
    rollout.replies.remember(message, result.reply())
    rollout.tool_calls += len(message.get("tool_calls") or ())
    renderer = core.renderer
    body_out = completion(
        result,
        message,
        completion_id=f"chatcmpl-{result.rid}",
        model=request.model or model_name,
        output_ids=result.output_ids,
        logprobs=result.output_logprobs if request.logprobs else None,
        token_text=lambda token: renderer.decode([token]),
        tito={
            "rollout_id": rollout.id,
            "branch": result.branch,
            "turn": result.turn,
            "matched_stop": result.matched_stop,
        },
    )
    return body_out, request


def translated(rollout: GatewayRollout, translate: Callable[[], T]) -> T:
    """``translate()``: a front's request as the chat-completions body it stands for.

    Its 400 sets the rollout's status, as a chat request's does.
    """
    try:
        return translate()
    except GatewayError as exc:
        rollout.rollout.fail(exc)
        raise


async def count_tokens(rollout: GatewayRollout, body: Any, options: CallOptions) -> int:
    """How many tokens the prompt of a chat-completions ``body`` renders to on ``rollout``, with nothing recorded.

    The whole conversation is rendered; it takes text only (an image part is a 400: no image reader is used, so
    counting never touches the rollout's kept images).
    """
    request = parse_request(body, rollout.replies, options.sampling, None)
    conversation = placed_system(request.conversation, rollout.rollout.renderer, rollout.id)
    tools = tool_specs_to_chat(conversation.tool_specs)
    return len(await rollout.rollout.renderer.initial_ids(conversation.chat(), tools))


def placed_system(conversation: Conversation, renderer: ChatRenderer, rollout_id: str) -> Conversation:
    """``conversation`` with its later system messages where the chat template can render them.

    In place when the template renders a system message where it stands (Qwen, Llama 3, GLM, Kimi, Gemma);
    otherwise joined into the system prompt (:meth:`Conversation.late_system_joined`): the system prompt then
    differs from the one the rollout's tokens began with, so the rollout forks ("the system prompt changed").
    """
    if renderer.renders_system_in_place or not any(m.get("role") == "system" for m in conversation.messages):
        return conversation
    logger.warning(
        "rollout %s: a system message after the first user message, which the chat template cannot render where "
        "it stands; it is joined into the system prompt and the rollout forks",
        rollout_id,
    )
    return conversation.late_system_joined()
