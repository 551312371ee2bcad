"""A recorded call (:class:`~tito_core.rollout_core.output.CallResult`) as an OpenAI ``ChatCompletion`` or its chunks.

The message is the parsed output: ``content``, ``reasoning_content``, ``tool_calls`` (arguments as JSON text). A
malformed call is not offered as a call: its raw text is appended to the content (the call is counted in the
trajectory's ``tool_parse_errors``). ``finish_reason`` is ``length`` at the token limit, ``tool_calls`` when the
output calls tools, else ``stop``. With ``logprobs`` every output token (the stop token included: it is what the
engine generated) comes with its logprob. The ``tito`` field carries the output ids, the rollout, branch and turn,
and the stop string or token id that ended generation when the engine says (``matched_stop``).
A stream is the same answer replayed as ``chat.completion.chunk`` events, ending with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..rollout_core import CallResult

__all__ = ["completion", "message_of", "sse_chunks"]


def message_of(result: CallResult) -> dict[str, Any]:
    """The ChatCompletion message of a recorded call (what the client will replay)."""
    parsed = result.parsed
    content = parsed.content
    calls = []
    for call in parsed.calls:
        if call.is_error:
            content = f"{content}\n{call.raw}".strip() if content else call.raw
            continue
        arguments = json.dumps(call.input, ensure_ascii=False)
        calls.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _finish_reason(result: CallResult, message: dict[str, Any]) -> str:
    if result.stop_reason == "max_tokens":
        return "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


def _logprobs(ids: Sequence[int], logprobs: Sequence[float | None], token_text: Callable[[int], str]) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        text = token_text(token_id)
        content.append(
            {
                "token": text,
                "logprob": logprob if logprob is not None else -9999.0,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return {"content": content, "refusal": None}


def completion(
    result: CallResult,
    message: dict[str, Any],
    *,
    completion_id: str,
    model: str,
    output_ids: Sequence[int],
    logprobs: Sequence[float | None] | None,
    token_text: Callable[[int], str],
    tito: dict[str, Any],
) -> dict[str, Any]:
    """The ChatCompletion body of a recorded call whose message is ``message`` (:func:`message_of`)."""
    usage = result.usage
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(result, message),
                "logprobs": None if logprobs is None else _logprobs(output_ids, logprobs, token_text),
            }
        ],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
        "tito": {"output_ids": list(output_ids), **tito},
    }


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def sse_chunks(body: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    """The ChatCompletion ``body`` replayed as server-sent ``chat.completion.chunk`` events and ``[DONE]``."""
    choice = body["choices"][0]
    message = choice["message"]
    head = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
        choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        return _event({**head, "choices": choices, **extra})

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("reasoning_content"):
        events.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        events.append(chunk({"content": message["content"]}, logprobs=choice["logprobs"]))
    elif choice["logprobs"] is not None:
        events.append(chunk({}, logprobs=choice["logprobs"]))
    for index, call in enumerate(message.get("tool_calls") or ()):
        delta = {**call, "index": index}
        events.append(chunk({"tool_calls": [delta]}))
    events.append(chunk({}, choice["finish_reason"], tito=body["tito"]))
    if include_usage:
        events.append(_event({**head, "choices": [], "usage": body["usage"]}))
    events.append(b"data: [DONE]\n\n")
    return events
