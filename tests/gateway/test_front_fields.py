"""Every front's 400 names the field as its caller wrote it, never a field of another front's wire format.

The Responses and Messages fronts used to translate their requests into chat-completions bodies: an orphan
``function_call_output`` at ``input[1]`` was reported as ``messages[1].role``, and with a ``system`` every Messages
index was off by one. Each front now decodes its own wire format into the neutral call (gateway/fronts/).
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.gateway.test_messages import client as messages_client
from tito_core.gateway import Gateway

from .test_chat_surface import client as chat_client

ORPHAN_CHAT = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "2"}]
UNANSWERED_CHAT = [
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
    {"role": "user", "content": "y"},
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": ORPHAN_CHAT}, "messages[1].role"),
        ({"messages": [{"role": "system", "content": "s"}, *ORPHAN_CHAT]}, "messages[2].role"),
        ({"messages": UNANSWERED_CHAT}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ],
    ids=["orphan-tool", "orphan-after-system", "unanswered", "part-type", "limit"],
)
async def test_chat_completions_400s_name_chat_fields(gateway: Gateway, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await chat_client(gateway.open()).chat.completions.create(model="m", **kwargs)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param, caught.value.body


ORPHAN_OUTPUT = [
    {"role": "user", "content": "x"},
    {"type": "function_call_output", "call_id": "c1", "output": "2"},
]
BAD_CALL = [
    {"role": "user", "content": "x"},
    {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{not json"},
    {"type": "function_call_output", "call_id": "c1", "output": "2"},
]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": ORPHAN_OUTPUT}, "input[1].type"),
        ({"input": ORPHAN_OUTPUT, "instructions": "be brief"}, "input[1].type"),
        ({"input": [*BAD_CALL[:2], {"role": "user", "content": "y"}]}, "input[1].arguments"),
        ({"input": [BAD_CALL[0], {**BAD_CALL[1], "arguments": "{}"}, {"role": "user", "content": "y"}]}, "input"),
        ({"input": [BAD_CALL[0], {**BAD_CALL[1], "arguments": "{}"}, {**BAD_CALL[2], "call_id": "c9"}]},
         "input[2].call_id"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ],
    ids=["orphan-output", "orphan-with-instructions", "bad-arguments", "unanswered", "unknown-call", "limit",
         "unknown-tool"],
)  # fmt: skip
async def test_responses_400s_name_responses_fields(gateway: Gateway, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await chat_client(gateway.open()).responses.create(model="m", **kwargs)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param, caught.value.body
    assert "messages" not in caught.value.body["message"]


ORPHAN_RESULT = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": ORPHAN_RESULT}, "messages[0].content[0].type"),
        ({"messages": ORPHAN_RESULT, "system": "be brief"}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "document"}]}], "system": "s"},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": [""]}, "stop_sequences"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, "tool_choice.type"),
    ],
    ids=["orphan-result", "orphan-with-system", "block-with-system", "stop", "any-without-tools"],
)  # fmt: skip
async def test_messages_400s_name_messages_fields(gateway: Gateway, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await messages_client(gateway.open()).messages.create(model="m", max_tokens=8, **kwargs)
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["param"] == param, body
