from __future__ import annotations

import pytest

from tito_core.conversation import tool_specs_to_chat
from tito_core.errors import TemplateError, UnsupportedContentError
from tito_core.render.renderer import ChatRenderer
from tito_core.strands_front.messages import system_text, to_chat_messages


def test_turn_tail_is_read_from_the_template(qwen3_tokenizer, qwen25_tokenizer):
    for tok in (qwen3_tokenizer, qwen25_tokenizer):
        renderer = ChatRenderer(tok)
        assert renderer.turn_tail == ("<|im_end|>", "\n")
        assert 151645 in renderer.end_of_turn_ids


def test_continuation_has_no_injected_system_prompt(qwen25_tokenizer):
    """Pitfall 4: rendering only new messages must not inject the default system prompt or tool block."""
    renderer = ChatRenderer(qwen25_tokenizer)
    text = renderer.continuation_text([{"role": "user", "content": "next"}])
    assert text == "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    assert "You are Qwen" not in text and "<tools>" not in text


def test_a_template_that_rewrites_earlier_text_is_a_real_error(qwen25_tokenizer):
    # This template renders the messages count first, so new messages change earlier text.
    template = "{{ messages | length }}{% for m in messages %}|{{ m.content }}{% endfor %}"
    renderer = ChatRenderer(qwen25_tokenizer, chat_template=template)
    with pytest.raises(TemplateError, match="cannot be tokenized incrementally"):
        renderer.continuation_text([{"role": "user", "content": "x"}])


def test_template_failures_are_template_errors(qwen25_tokenizer):
    renderer = ChatRenderer(qwen25_tokenizer, chat_template="{{ raise_exception('No user query found') }}")
    with pytest.raises(TemplateError, match="No user query found"):
        renderer.render([{"role": "user", "content": "x"}], add_generation_prompt=True)


def test_enable_thinking_false_is_passed_to_the_template(qwen3_tokenizer):
    renderer = ChatRenderer(qwen3_tokenizer, template_kwargs={"enable_thinking": False})
    text = renderer.initial_text([{"role": "user", "content": "q"}], None)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_message_conversion():
    messages = [
        {"role": "user", "content": [{"text": "a"}, {"cachePoint": {"type": "default"}}, {"text": "b"}]},
        {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "think"}}},
            {"text": "visible"},
            {"toolUse": {"toolUseId": "2", "name": "f", "input": {"x": 1}}},
            {"toolUse": {"toolUseId": "10", "name": "g", "input": {}}},
        ]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "10", "content": [{"text": "G"}]}},
            {"toolResult": {"toolUseId": "2", "content": [{"json": {"v": 1}}]}},
        ]},
    ]  # fmt: skip
    chat = to_chat_messages(messages, system_prompt="sys")
    assert chat[0] == {"role": "system", "content": "sys"}
    assert chat[1] == {"role": "user", "content": "a\nb"}
    assert chat[2]["reasoning_content"] == "think" and chat[2]["content"] == "visible"
    assert [c["function"]["name"] for c in chat[2]["tool_calls"]] == ["f", "g"]
    # ids "2" and "10" keep call order, not string order
    assert [(m["tool_call_id"], m["content"]) for m in chat[3:]] == [("2", '{"v": 1}'), ("10", "G")]


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ({"image": {"format": "png", "source": {"bytes": b"x"}}}, "image"),
        ({"document": {"name": "d", "format": "pdf", "source": {"bytes": b"x"}}}, "document"),
        ({"toolResult": {"toolUseId": "t", "content": [{"image": {}}]}}, "source.bytes"),
        ({"toolResult": {"toolUseId": "t", "content": [{"document": {}}]}}, "only text, json and image"),
        ({"video": {"format": "mp4", "source": {"bytes": b"x"}}}, "video"),
        ({"mystery": {}}, "mystery"),
    ],
)
def test_unsupported_content_is_named(block, match):
    with pytest.raises(UnsupportedContentError, match=match):
        to_chat_messages([{"role": "user", "content": [block]}])


def test_redacted_reasoning_is_rejected():
    with pytest.raises(UnsupportedContentError, match="redacted"):
        to_chat_messages([{"role": "assistant", "content": [{"reasoningContent": {"redactedContent": b"x"}}]}])


def test_system_prompt_content_and_tool_specs():
    assert system_text(None, [{"text": "a"}, {"cachePoint": {"type": "default"}}, {"text": "b"}]) == "a\nb"
    assert system_text("plain", None) == "plain"
    spec = {"name": "f", "description": "d", "inputSchema": {"json": {"type": "object"}}}
    assert tool_specs_to_chat([spec]) == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    assert tool_specs_to_chat([]) is None


def test_tokenizer_without_template_is_an_error(qwen25_tokenizer):
    class NoTemplate:
        chat_template = None

    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(NoTemplate())  # type: ignore[arg-type]
