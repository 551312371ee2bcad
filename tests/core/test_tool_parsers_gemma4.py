"""Gemma 4 tool calls, checked on outputs rendered by the published template (trl's ``gemma4.jinja``).

The template is rendered with jinja through transformers (the Gemma 4 vocabulary is only needed for token
ids, which the fidelity matrix checks); the model's turn is cut out of the render and parsed back.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tito_core.plugins import get_tool_parser
from tito_core.tool_parsers import Gemma4ToolParser, infer_tool_parser
from tito_testing.tokenizers import chat_template

TEMPLATE = chat_template("gemma4")
PARSER = Gemma4ToolParser()


def model_turn(tokenizer: Any, calls: list[tuple[str, dict[str, Any]]], reasoning: str | None = None) -> str:
    """What the model generates for an assistant turn with these calls: the render after ``<|turn>model\\n``."""
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
    }
    if reasoning:
        assistant["reasoning_content"] = reasoning
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go"}, assistant], chat_template=TEMPLATE, tokenize=False
    )
    return text.split("<|turn>model\n", 1)[1]


ARGS = {"city": "Zürich 東京 🙂 {a:b}, [x]", "days": 3, "ratio": 2.5, "ok": True, "none": None, "tags": ["a", "b"]}


def test_registered_and_inferred_from_the_template(qwen3_tokenizer):
    assert isinstance(get_tool_parser("gemma4"), Gemma4ToolParser)
    assert infer_tool_parser(qwen3_tokenizer, TEMPLATE) == "gemma4"


def test_parallel_calls_with_reasoning_round_trip(qwen3_tokenizer):
    calls = [("get_weather", ARGS), ("lookup", {}), ("nested", {"o": {"k": [1, {"z": "<tool_call|>"}]}})]
    text = model_turn(qwen3_tokenizer, calls, reasoning="I should check.")
    assert text.startswith("<|channel>thought\nI should check.\n<channel|><|tool_call>call:get_weather{")
    assert text.endswith("<|tool_response>")
    out = PARSER.parse(text)
    assert [(c.name, c.input, c.error) for c in out.calls] == [(n, a, None) for n, a in calls]
    assert out.reasoning == "I should check." and out.content == ""
    assert "".join(c.raw for c in out.calls) in text
    assert len({c.id for c in out.calls}) == 3


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), VALUES, max_size=4))
def test_any_arguments_the_template_writes_parse_back(arguments):
    from tito_testing.tokenizers import load_qwen_tokenizer

    if any('<|"|>' in v for v in _strings(arguments)):
        return  # the format cannot quote its own quote marker
    text = model_turn(load_qwen_tokenizer("qwen3"), [("f", arguments)])
    out = PARSER.parse(text)
    assert [(c.name, c.input, c.error) for c in out.calls] == [("f", _sorted(arguments), None)]


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("text", "error", "name"),
    [
        ('<|tool_call>call:get{city:<|"|>x<|"|>}', "not closed", "get"),
        ("<|tool_call>call:get{city:Zurich}<tool_call|>", "expected a value", "get"),
        ("<|tool_call>call:get{a:1,a:2}<tool_call|>", "duplicate argument", "get"),
        ("<|tool_call>call:get{a:1} extra<tool_call|>", "unexpected text", "get"),
        ("<|tool_call>get{a:1}<tool_call|>", "starts with 'call:'", "unknown_tool"),
        ("<|tool_call>call:{a:1}<tool_call|>", "no name", "unknown_tool"),
        ('<|tool_call>call:get{a:<|"|>open}<tool_call|>', "not closed", "get"),
    ],
)
def test_malformed_calls_keep_their_raw_text(text, error, name):
    out = PARSER.parse("Sure. " + text)
    [call] = out.calls
    assert call.is_error and error in (call.error or "") and call.name == name
    assert call.raw in text and call.input == {}


def test_calls_inside_reasoning_are_never_returned():
    text = '<|channel>thought\ndraft <|tool_call>call:rm{path:<|"|>/<|"|>}<tool_call|><channel|>The answer is 4.'
    out = PARSER.parse(text)
    assert out.calls == [] and out.content == "The answer is 4." and "draft" in (out.reasoning or "")
