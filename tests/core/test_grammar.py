"""Forced tool calls: tool_choice resolution and the model wiring (no grammar engine needed).

What the grammars admit is tested against xgrammar, the engines' own grammar library, in
tests/transformers/test_grammar_syntax.py (it needs torch).
"""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel
from strands import tool

from tests.helpers import agent_for
from tito_core import TitoModel
from tito_core.errors import ConfigError
from tito_core.grammar import (
    Ebnf,
    GrammarToolParser,
    ToolChoiceError,
    answer_grammar,
    forced_tools,
    tool_call_grammar,
    tool_choice_option,
)
from tito_core.tool_parsers import (
    HermesToolParser,
    MistralToolParser,
)
from tito_testing.scripted import ScriptedBackend

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

    agent = agent_for(model, [add])
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
    agent = agent_for(model, [add])
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


def test_an_included_grammar_keeps_its_rules_and_its_root_gets_a_name() -> None:
    ebnf = Ebnf()
    foreign = (
        'root ::= "call " args\nargs ::= json_integer\n  | "none"\njson_integer ::= ' + '"-"? ( "0" | [1-9] [0-9]* )'
    )
    name = ebnf.include(foreign, "tool_call")
    text = ebnf.text(f'{name} | "x"')
    assert text.splitlines()[:3] == [
        'root ::= tool_call | "x"',
        'args ::= json_integer | "none"',
        'tool_call ::= "call " args',
    ]
    assert text.count("json_integer ::=") == 1
    with pytest.raises(ConfigError, match="no root rule"):
        Ebnf().include('args ::= "a"', "call")
    with pytest.raises(ConfigError, match="defines 'json_string' otherwise"):
        Ebnf().include('root ::= json_string\njson_string ::= "s"', "call")


def test_answer_grammar_is_the_schema_or_a_call() -> None:
    assert answer_grammar({"type": "integer"}).splitlines()[0] == "root ::= json_integer"
    call = HermesToolParser().call_grammar([ADD])
    assert answer_grammar({"type": "boolean"}, call=call).splitlines()[0] == "root ::= tool_call | answer"


@pytest.mark.parametrize("kind", ["array", "array of objects"])
def test_a_deeply_nested_schema_gives_a_grammar_linear_in_its_depth(kind: str) -> None:
    """An array's item is a rule of its own, not copied twice into the array's rule: a tool schema 20 arrays deep
    made a 37 MB grammar and one 60 deep took the gateway's memory (one request). Rule names stay short."""

    def nested(depth: int) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer"}
        for _ in range(depth):
            schema = {"type": "array", "items": schema}
            if kind == "array of objects":
                schema = {"type": "object", "properties": {"x": schema}}
        return {
            "name": "deep",
            "description": "",
            "inputSchema": {"json": {"type": "object", "properties": {"v": schema}}},
        }

    size10, size20 = (len(tool_call_grammar(HermesToolParser(), [nested(depth)])) for depth in (10, 20))
    assert size20 < 2.5 * size10  # linear, not 2**10 times larger
    assert len(tool_call_grammar(HermesToolParser(), [nested(60)])) < 10 * size10
