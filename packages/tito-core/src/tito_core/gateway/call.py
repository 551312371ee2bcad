"""The neutral call: what every front decodes its wire request into, and what it encodes its answer from.

A front (:mod:`tito_core.gateway.fronts`) turns its request into a :class:`CallRequest` (tito's
:class:`~tito_core.conversation.Conversation`, the sampling fields the caller set, the tool choice, the answer's
schema) and gets back a :class:`CallAnswer`: the recorded output as content, reasoning and tool calls, why it ended,
its usage, ids and logprobs. No front sees another front's wire format, and none reads the trajectory:
:func:`answer_call` runs the call on the rollout's core and builds the answer from its
:class:`~tito_core.rollout_core.output.CallResult` alone.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from ..backend import SamplingParams
from ..conversation import ChatMessage, Conversation, tool_specs_to_chat
from ..errors import BackendConnectionError, ConfigError
from ..render import ChatRenderer
from ..rollout_core.labels import Label
from .errors import GatewayError, bad_request, error_of

if TYPE_CHECKING:
    from ..rollout_core import CallResult
    from .registry import GatewayRollout

__all__ = ["CallAnswer", "CallRequest", "OutputToken", "ToolCallOut", "answer_call", "count_prompt", "placed_system"]

logger = logging.getLogger("tito")


class CallRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One model call as a front decoded it.

    Attributes:
        conversation: The messages in tito's form (replayed replies already exact), the system prompt, the tools.
        sampling: The sampling fields the caller set, by :class:`~tito_core.backend.SamplingParams` name
            (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``), over the configured ones.
        fields: For each of ``sampling``, the caller's own name for it (``max_output_tokens``): errors name it.
        tool_choice: tito's tool choice (``{"auto": {}}``, ``{"any": {}}``, ``{"tool": {"name": ...}}``), None for
            the configured one.
        answer_schema: The JSON schema a structured answer follows, None for free text.
        logprobs: Answer with every output token's logprob.
        stream: Answer as server-sent events.
        model: The model the caller named (echoed back; the gateway's own name when empty).
    """

    conversation: Conversation
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    fields: dict[str, str] = msgspec.field(default_factory=dict)
    tool_choice: dict[str, Any] | None = None
    answer_schema: dict[str, Any] | None = None
    logprobs: bool = False
    stream: bool = False
    model: str = ""

    def sampling_over(self, base: SamplingParams) -> SamplingParams:
        """The configured sampling with the caller's fields over it.

        Raises:
            GatewayError: 400 naming the caller's field a value does not fit.
        """
        if not self.sampling:
            return base
        try:
            return msgspec.structs.replace(base, **self.sampling)
        except (ConfigError, msgspec.ValidationError, TypeError) as exc:
            name = next((k for k in self.sampling if k in str(exc)), None)
            raise bad_request(self.fields.get(name or "", "body"), str(exc)) from None


class ToolCallOut(msgspec.Struct, frozen=True):
    """A tool call of the output: its id, the tool's name, and the arguments (an object, and as JSON text)."""

    id: str
    name: str
    arguments: dict[str, Any]
    arguments_json: str


class OutputToken(msgspec.Struct, frozen=True, array_like=True):
    """One output token with its logprob and text (``logprobs`` answers)."""

    text: str
    logprob: float | None


class CallAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded call, as every front answers it.

    Attributes:
        id: The call's id (the engine request's): fronts prefix it (``chatcmpl-``, ``resp_``, ``msg_``).
        created: Unix time of the answer.
        model: The model name to answer with.
        content: The output's text; a malformed tool call is not offered as a call, its raw text is appended here
            (the trajectory counts it in ``tool_parse_errors``).
        reasoning: The output's reasoning, or None.
        tool_calls: The well-formed tool calls, in order.
        finish: ``length`` at the token limit, ``tool_calls`` when the output calls tools, else ``stop``.
        stop_sequence: The caller's stop string generation ended on, when the engine says so (else None).
        prompt_tokens: The prompt's length in tokens.
        completion_tokens: The output's length in tokens.
        output_ids: The output's token ids, as recorded.
        tokens: Every output token's text and logprob (the stop token included), when the caller asked.
        tito: tito's own fields: the output ids, the rollout, branch and turn, and ``matched_stop`` (the stop
            string or token id that ended generation, when the engine says); ``sampling_mask_missing`` and
            ``routed_experts_missing`` when the record says why it lacks kept sets or routing; ``lineage`` (the
            call's label) when it had one.
    """

    id: str
    created: int
    model: str
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish: str
    stop_sequence: str | None
    prompt_tokens: int
    completion_tokens: int
    output_ids: tuple[int, ...]
    tokens: tuple[OutputToken, ...] | None
    tito: dict[str, Any]

    def message(self) -> ChatMessage:
        """The answer as the assistant message a client replays (what the reply book matches)."""
        message: ChatMessage = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


async def answer_call(
    rollout: GatewayRollout, request: CallRequest, model_name: str, label: Label | None = None
) -> CallAnswer:
    """Run ``request`` on ``rollout`` (claimed by the caller) and answer it; ``label`` names the call's lineage.

    Raises:
        GatewayError: 400 (a sampling field tito cannot honour, named), or the error a failed model call maps to
            (:func:`~tito_core.gateway.errors.error_of`); the rollout has its status.
    """
    core = rollout.core
    try:
        options = msgspec.structs.replace(rollout.options, sampling=request.sampling_over(rollout.options.sampling))
    except GatewayError as exc:
        core.fail(exc)
        raise
    conversation = placed_system(request.conversation, core.renderer, rollout.id)
    try:
        result = await rollout.run_call(
            core.call(
                conversation,
                options,
                tool_choice=request.tool_choice,
                answer_schema=request.answer_schema,
                label=label,
            )
        )
    except Exception as exc:  # the rollout has its status; the client gets its front's error
        rollout.lost_engine |= isinstance(exc, BackendConnectionError)
        raise error_of(exc) from exc
    parsed = result.parsed
    content = parsed.content
    calls: list[ToolCallOut] = []
    for call in parsed.calls:
        if call.is_error:
            content = f"{content}\n{call.raw}".strip() if content else call.raw
            continue
        calls.append(ToolCallOut(call.id, call.name, dict(call.input), json.dumps(call.input, ensure_ascii=False)))
    finish = "length" if result.stop_reason == "max_tokens" else "tool_calls" if calls else "stop"
    stops = request.sampling.get("stop") or ()
    matched = result.matched_stop
    renderer = core.renderer
    tokens = None
    if request.logprobs:
        pairs = zip(result.output_ids, result.output_logprobs or [None] * len(result.output_ids), strict=True)
        tokens = tuple(OutputToken(renderer.decode([token]), logprob) for token, logprob in pairs)
    answer = CallAnswer(
        id=result.rid,
        created=int(time.time()),
        model=request.model or model_name,
        content=content,
        reasoning=parsed.reasoning or None,
        tool_calls=tuple(calls),
        finish=finish,
        stop_sequence=matched if finish == "stop" and isinstance(matched, str) and matched in stops else None,
        prompt_tokens=result.usage.prompt_tokens,
        completion_tokens=result.usage.completion_tokens,
        output_ids=result.output_ids,
        tokens=tokens,
        tito={
            "output_ids": list(result.output_ids),
            "rollout_id": rollout.id,
            "branch": result.branch,
            "turn": result.turn,
            "matched_stop": matched,
            **_flags(result),
        },
    )
    if label is not None:
        answer.tito["lineage"] = label.name
    rollout.replies.remember(answer.message(), result.reply())
    rollout.tool_calls += len(calls)
    return answer


def _flags(result: CallResult) -> dict[str, Any]:
    """What the record says is missing from the behaviour distribution (no kept sets, no routing), when it is."""
    flags = {
        "sampling_mask_missing": result.sampling_mask_missing,
        "routed_experts_missing": result.routed_experts_missing,
    }
    return {key: value for key, value in flags.items() if value is not None}


async def count_prompt(rollout: GatewayRollout, request: CallRequest) -> int:
    """How many tokens the prompt of ``request`` renders to on ``rollout``, with nothing recorded.

    The whole conversation is rendered.
    """
    conversation = placed_system(request.conversation, rollout.core.renderer, rollout.id)
    tools = tool_specs_to_chat(conversation.tool_specs)
    return len(await rollout.core.renderer.initial_ids(conversation.chat(), tools))


def placed_system(conversation: Conversation, renderer: ChatRenderer, rollout_id: str) -> Conversation:
    """``conversation`` with its later system messages where the chat template can render them.

    In place when the template renders a system message where it stands (Qwen, Llama 3, GLM, Kimi, Gemma);
    otherwise joined into the system prompt (:meth:`Conversation.late_system_joined`): the system prompt then
    differs from the one the rollout's tokens began with, so the call starts a new lineage ("a new lineage (the
    system prompt changed)").
    """
    if renderer.renders_system_in_place or not any(m.get("role") == "system" for m in conversation.messages):
        return conversation
    logger.warning(
        "rollout %s: a system message after the first user message, which the chat template cannot render where "
        "it stands; it is joined into the system prompt and the rollout forks",
        rollout_id,
    )
    return conversation.late_system_joined()
