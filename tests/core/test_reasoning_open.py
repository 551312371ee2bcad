"""A call's arguments are data; whether the prompt left a reasoning block open is read off its tokens."""

from __future__ import annotations

import asyncio
import json

import pytest

from tito_core.conversation import Conversation
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_testing.scripted import ScriptedBackend
from tito_testing.vision import vl_chat_template

TOOLS = [{"name": "echo", "description": "echo", "inputSchema": {"json": {"type": "object"}}}]
USER = [{"role": "user", "content": "hi"}]


def hermes_call(text: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "echo", "arguments": {"text": text}}) + "\n</tool_call>"


def first_call(tokenizer, renderer: ChatRenderer, parser: str, reply: str):
    backend = ScriptedBackend(tokenizer, [reply])
    run = Rollout(backend, renderer, get_tool_parser(parser))
    return asyncio.run(run.call(Conversation(messages=USER, tool_specs=TOOLS), CallOptions())).parsed


def test_generation_prompts_say_whether_reasoning_is_open(qwen25_tokenizer, qwen3_tokenizer) -> None:
    qwen35 = vl_chat_template()
    cases = [
        (ChatRenderer(qwen25_tokenizer), False),  # <|im_start|>assistant\n
        (ChatRenderer(qwen3_tokenizer), False),  # Qwen3 leaves <think> to the model
        (ChatRenderer(qwen3_tokenizer, chat_template=qwen35), True),  # ...assistant\n<think>\n
        (ChatRenderer(qwen3_tokenizer, chat_template=qwen35, template_kwargs={"enable_thinking": False}), False),
    ]
    for renderer, opened in cases:
        prompt = renderer.encode(renderer.initial_text(USER, None))
        assert renderer.opens_reasoning(prompt, "<think>", "</think>") is opened
        # a prompt that does not end with the generation prompt is not known to open one
        assert renderer.opens_reasoning(prompt[:-1], "<think>", "</think>") is False
        assert renderer.opens_reasoning([], "<think>", "</think>") is False


@pytest.mark.parametrize("tokenizer", ["qwen25_tokenizer", "qwen3_tokenizer"])
def test_a_first_call_quoting_think_end_is_a_call(request, tokenizer: str) -> None:
    # Found by the rollout property test: the call was read as reasoning and the rollout stopped.
    tok = request.getfixturevalue(tokenizer)
    reply = hermes_call("</think>")
    parsed = first_call(tok, ChatRenderer(tok), "hermes", reply)
    assert [(c.name, c.input, c.raw, c.error) for c in parsed.calls] == [("echo", {"text": "</think>"}, reply, None)]
    assert parsed.reasoning is None and parsed.content == ""


def test_a_pre_opened_block_keeps_a_draft_call_in_reasoning(qwen3_tokenizer) -> None:
    renderer = ChatRenderer(qwen3_tokenizer, chat_template=vl_chat_template())
    draft = "<tool_call>\n<function=echo>\n<parameter=text>\nrm\n</parameter>\n</function>\n</tool_call>"
    parsed = first_call(qwen3_tokenizer, renderer, "qwen_xml", f"maybe {draft}")  # no </think>: still thinking
    assert parsed.calls == [] and parsed.content == ""
    assert parsed.reasoning == f"maybe {draft}"
