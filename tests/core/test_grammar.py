"""Forced tool calls: grammars from tool schemas, tool_choice resolution, and the model wiring.

Grammars are checked with an independent matcher (llguidance, which reads the GBNF dialect; a test-only
dependency installed by ``nox -s tests_core``) over a byte-level tokenization, so a test fails if a grammar
admits a wrong call or refuses a right one.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import llguidance
import llguidance.hf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from tito_core import TitoModel
from tito_core.errors import ConfigError
from tito_core.grammar import (
    GrammarToolParser,
    ToolChoiceError,
    forced_tools,
    tool_call_grammar,
    tool_choice_option,
)
from tito_core.testing.scripted import ScriptedBackend
from tito_core.tool_parsers import (
    HermesToolParser,
    Llama3JSONToolParser,
    MistralToolParser,
    QwenXMLToolParser,
)

from .helpers import hermes_call

ADD: Any = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "json": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["a", "b"],
        }
    },
}
SEARCH: Any = {
    "name": "search",
    "description": "Search.",
    "inputSchema": {
        "json": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "mode": {"enum": ["fast", "deep"]},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filter": {"$ref": "#/$defs/Filter"},
            },
            "required": ["query"],
            "$defs": {
                "Filter": {
                    "type": "object",
                    "properties": {"field": {"type": "string"}, "value": {"type": "number"}},
                    "required": ["field", "value"],
                }
            },
        }
    },
}


@pytest.fixture(scope="module")
def matcher_tokenizer(qwen3_tokenizer: Any) -> Any:
    return llguidance.hf.from_tokenizer(qwen3_tokenizer)


@pytest.fixture
def accepts(matcher_tokenizer: Any) -> Any:
    def check(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(matcher_tokenizer, llguidance.grammar_from("gbnf", grammar))
        assert not matcher.is_error(), matcher.get_error()
        # greedy byte-level pieces: the text itself, not the tokenizer's special tokens for <tool_call>
        ok = matcher.consume_tokens(matcher_tokenizer.greedy_tokenize(text))
        return bool(ok) and matcher.is_accepting() and not matcher.is_error()

    return check


# -- tool_choice ------------------------------------------------------------------------------------


def test_tool_choice_forms() -> None:
    assert forced_tools([ADD, SEARCH], None) is None
    assert forced_tools([ADD, SEARCH], {"auto": {}}) is None
    assert forced_tools([ADD, SEARCH], {"any": {}}) == [ADD, SEARCH]
    assert forced_tools([ADD, SEARCH], {"tool": {"name": "search"}}) == [SEARCH]
    assert tool_choice_option("required") == {"any": {}}
    assert tool_choice_option("auto") is None
    assert tool_choice_option({"tool": {"name": "add"}}) == {"tool": {"name": "add"}}


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        ([ADD], {"tool": {"name": "ad"}}, "not offered (tools: add); did you mean `add`?"),
        ([], {"any": {}}, "no tools were offered"),
        ([ADD], {"none": {}}, "tool_choice must be"),
        ([ADD], "any", "tool_choice must be"),
    ],
)
def test_bad_tool_choice_is_a_clear_error(tools: list[Any], choice: Any, message: str) -> None:
    with pytest.raises(ToolChoiceError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        forced_tools(tools, choice)


def test_bad_tool_choice_option() -> None:
    with pytest.raises(ToolChoiceError, match="got 'some_tool'"):
        tool_choice_option("some_tool")


def test_parser_without_grammar_says_so() -> None:
    assert not isinstance(MistralToolParser(), GrammarToolParser)
    with pytest.raises(ToolChoiceError, match="'mistral' tool parser cannot constrain tool calls"):
        tool_call_grammar(MistralToolParser(), [ADD])


# -- grammars ---------------------------------------------------------------------------------------


def test_hermes_grammar_admits_canonical_calls_only(accepts: Any) -> None:
    grammar = HermesToolParser().call_grammar([ADD])
    assert accepts(grammar, hermes_call("add", {"a": 1, "b": -22}))
    assert accepts(grammar, hermes_call("add", {"a": 1, "b": 2, "note": 'say "hi"\n'}))
    assert not accepts(grammar, hermes_call("add", {"a": 1}))  # b is required
    assert not accepts(grammar, hermes_call("add", {"b": 2, "a": 1}))  # schema order
    assert not accepts(grammar, hermes_call("add", {"a": 1.5, "b": 2}))  # integer
    assert not accepts(grammar, hermes_call("add", {"a": 1, "b": 2, "c": 3}))  # no extra keys
    assert not accepts(grammar, hermes_call("add", {"a": 1, "b": 2}, compact=True))  # canonical separators
    assert not accepts(grammar, hermes_call("sub", {"a": 1, "b": 2}))
    assert not accepts(grammar, "Sure! " + hermes_call("add", {"a": 1, "b": 2}))


def test_grammar_alternatives_and_schema_features(accepts: Any) -> None:
    grammar = HermesToolParser().call_grammar([ADD, SEARCH])
    assert accepts(grammar, hermes_call("add", {"a": 0, "b": 0}))
    full = {"query": "x", "mode": "deep", "limit": None, "tags": ["a", "b"], "filter": {"field": "f", "value": 1e-3}}
    assert accepts(grammar, hermes_call("search", full))
    assert accepts(grammar, hermes_call("search", {"query": "x", "limit": 3}))
    assert accepts(grammar, hermes_call("search", {"query": "x", "tags": []}))
    assert not accepts(grammar, hermes_call("search", {"query": "x", "mode": "slow"}))  # enum
    assert not accepts(grammar, hermes_call("search", {"query": "x", "filter": {"field": "f"}}))  # $ref required
    assert not accepts(grammar, hermes_call("search", {"mode": "fast"}))  # query required


def test_optional_only_object(accepts: Any) -> None:
    spec: Any = {
        "name": "f",
        "inputSchema": {"json": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {}}}},
    }
    grammar = HermesToolParser().call_grammar([spec])
    for args in ({}, {"x": True}, {"y": [1, {"k": None}]}, {"x": False, "y": "s"}):
        assert accepts(grammar, hermes_call("f", args)), args
    assert not accepts(grammar, '<tool_call>\n{"name": "f", "arguments": {, "y": 1}}\n</tool_call>')


def test_llama3_grammar(accepts: Any) -> None:
    grammar = Llama3JSONToolParser().call_grammar([ADD])
    call = json.dumps({"name": "add", "parameters": {"a": 1, "b": 2}})
    assert accepts(grammar, call)
    assert not accepts(grammar, json.dumps({"name": "add", "arguments": {"a": 1, "b": 2}}))
    parsed = Llama3JSONToolParser().parse(call, [ADD])
    assert [(c.name, c.input) for c in parsed.calls] == [("add", {"a": 1, "b": 2})]


def _qwen_xml(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen_xml_grammar(accepts: Any) -> None:
    grammar = QwenXMLToolParser().call_grammar([ADD, SEARCH])
    assert accepts(grammar, _qwen_xml("add", {"a": "1", "b": "2", "note": "a < b, multi\nline"}))
    assert accepts(grammar, _qwen_xml("search", {"query": "x", "mode": '"fast"', "limit": "null"}))
    assert not accepts(grammar, _qwen_xml("add", {"a": "one", "b": "2"}))
    assert not accepts(grammar, _qwen_xml("add", {"a": "1"}))
    assert not accepts(grammar, _qwen_xml("add", {"a": "1", "b": "2", "note": "</b>"}))


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
scalars = st.sampled_from(
    [
        ({"type": "integer"}, st.integers()),
        ({"type": "string"}, st.text(max_size=12)),
        ({"type": "boolean"}, st.booleans()),
    ]
)


@st.composite
def schema_and_arguments(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    keys = draw(st.lists(names, min_size=0, max_size=4, unique=True))
    props, args, required = {}, {}, []
    for key in keys:
        schema, values = draw(scalars)
        props[key] = schema
        if draw(st.booleans()):
            required.append(key)
            args[key] = draw(values)
        elif draw(st.booleans()):
            args[key] = draw(values)
    ordered = {k: args[k] for k in keys if k in args}
    return {"type": "object", "properties": props, "required": required}, ordered


@settings(max_examples=60, deadline=None)
@given(case=schema_and_arguments())
def test_grammar_admits_every_valid_call_and_the_parser_reads_it_back(case: Any, matcher_tokenizer: Any) -> None:
    schema, args = case
    spec: Any = {"name": "tool", "inputSchema": {"json": schema}}
    parser = HermesToolParser()
    text = hermes_call("tool", args)
    matcher = llguidance.LLMatcher(matcher_tokenizer, llguidance.grammar_from("gbnf", parser.call_grammar([spec])))
    assert matcher.consume_tokens(matcher_tokenizer.greedy_tokenize(text)) and matcher.is_accepting(), text
    assert [(c.name, c.input, c.error) for c in parser.parse(text, [spec]).calls] == [("tool", args, None)]


# -- the model --------------------------------------------------------------------------------------


class GrammarBackend(ScriptedBackend):
    """A scripted backend that says it applies grammars (the script must follow them)."""

    supports_grammar = True


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_forced_first_call_sends_the_grammar_then_auto(qwen3_tokenizer: Any) -> None:
    backend = GrammarBackend(qwen3_tokenizer, [hermes_call("add", {"a": 2, "b": 3}), "5"])
    model = TitoModel(backend, qwen3_tokenizer, tool_choice="any")

    def back_to_auto(event: Any) -> None:
        model.update_config(tool_choice="auto")

    from strands.hooks import AfterToolCallEvent

    agent = Agent(model=model, tools=[add], callback_handler=None, conversation_manager=NullConversationManager())
    agent.hooks.add_callback(AfterToolCallEvent, back_to_auto)
    agent("2 + 3?")
    first, second = backend.requests
    assert first.grammar == HermesToolParser().call_grammar([add.tool_spec])
    assert second.grammar is None
    assert [turn.constrained for turn in model.trajectory.turns] == [True, False]
    assert model.trajectory.status == "completed"
    assert model.get_config()["tool_choice"] is None


def test_forced_call_on_a_backend_without_grammars_fails_before_sending(qwen3_tokenizer: Any) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, [hermes_call("add", {"a": 2, "b": 3})])
    model = TitoModel(backend, qwen3_tokenizer, tool_choice={"tool": {"name": "add"}})
    agent = Agent(model=model, tools=[add], callback_handler=None, conversation_manager=NullConversationManager())
    with pytest.raises(Exception, match="cannot constrain decoding") as info:
        agent("2 + 3?")
    assert isinstance(info.value, ToolChoiceError) or isinstance(info.value.__cause__, ToolChoiceError)
    assert backend.requests == []
    assert model.trajectory.status == "failed"
    assert "ToolChoiceError" in (model.trajectory.status_reason or "")


def test_bad_tool_choice_option_is_a_config_error(qwen3_tokenizer: Any) -> None:
    with pytest.raises(ToolChoiceError):
        TitoModel(GrammarBackend(qwen3_tokenizer, []), qwen3_tokenizer, tool_choice="always")


class Pair(BaseModel):
    """Two small numbers."""

    a: Literal[1, 2, 3]
    b: int


def pair_spec() -> Any:
    from strands.tools.structured_output.structured_output_utils import convert_pydantic_to_tool_spec

    return convert_pydantic_to_tool_spec(Pair)


async def test_structured_output_forces_the_output_tool(qwen3_tokenizer: Any) -> None:
    backend = GrammarBackend(qwen3_tokenizer, [hermes_call("Pair", {"a": 2, "b": 7})])
    model = TitoModel(backend, qwen3_tokenizer)
    events = [event async for event in model.structured_output(Pair, [{"role": "user", "content": [{"text": "go"}]}])]
    assert events[-1]["output"] == Pair(a=2, b=7)
    (request,) = backend.requests
    assert request.grammar == HermesToolParser().call_grammar([pair_spec()])
    assert '( "1" | "2" | "3" )' in request.grammar  # the Literal became an enum in the grammar


async def test_structured_output_without_grammar_support_asks_unconstrained(qwen3_tokenizer: Any) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, [hermes_call("Pair", {"a": 2, "b": 7})])
    model = TitoModel(backend, qwen3_tokenizer)
    events = [event async for event in model.structured_output(Pair, [{"role": "user", "content": [{"text": "go"}]}])]
    assert events[-1]["output"] == Pair(a=2, b=7)
    assert backend.requests[0].grammar is None


def test_tool_choice_from_a_config_file(tmp_path: Any, qwen3_tokenizer: Any) -> None:
    from tito_core import load_config

    path = tmp_path / "tito.toml"
    path.write_text('backend = "scripted"\ntool_choice = "required"\n')
    model = load_config(path).create_model(GrammarBackend(qwen3_tokenizer, []), tokenizer=qwen3_tokenizer)
    assert model.get_config()["tool_choice"] == {"any": {}}
    path.write_text('backend = "scripted"\ntool_choice = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"tito\.toml: tool_choice must be .* got 'sometimes'"):
        load_config(path)
