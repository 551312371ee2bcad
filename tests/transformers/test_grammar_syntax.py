"""What the tool-call grammars admit, checked with xgrammar: the grammar library behind vLLM's and SGLang's
structured outputs (their default backend) and the embedded backend, so a grammar means here what it
means on every engine. A test fails if a grammar admits a wrong call or refuses a right one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tito_core.grammar import answer_grammar
from tito_core.tool_parsers import HermesToolParser, Llama3JSONToolParser, QwenXMLToolParser

from ..core.helpers import hermes_call
from ..core.test_grammar import ADD, SEARCH

xgr = pytest.importorskip("xgrammar")

IM_END = 151645


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> Any:
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[IM_END])
    return xgr.GrammarCompiler(info)


def _accepts(compiler: Any, grammar: str, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
    return bool(matcher.accept_string(text) and matcher.accept_token(IM_END) and matcher.is_terminated())


@pytest.fixture
def accepts(compiler: Any) -> Any:
    return lambda grammar, text: _accepts(compiler, grammar, text)


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
    assert accepts(grammar, _qwen_xml("search", {"query": "x", "mode": "fast", "limit": "null"}))
    assert not accepts(grammar, _qwen_xml("search", {"query": "x", "mode": '"fast"'}))  # enum strings are raw text
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
def test_grammar_admits_every_valid_call_and_the_parser_reads_it_back(case: Any, compiler: Any) -> None:
    schema, args = case
    spec: Any = {"name": "tool", "inputSchema": {"json": schema}}
    parser = HermesToolParser()
    text = hermes_call("tool", args)
    assert _accepts(compiler, parser.call_grammar([spec]), text), text
    assert [(c.name, c.input, c.error) for c in parser.parse(text, [spec]).calls] == [("tool", args, None)]


def test_answer_grammar_admits_the_schemas_json_and_with_tools_one_call(accepts: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name"],
        "additionalProperties": False,
    }
    answer = answer_grammar(schema)
    assert accepts(answer, json.dumps({"name": "Paris", "tags": ["a", "b"]}))
    assert accepts(answer, json.dumps({"name": "x"}))
    assert not accepts(answer, json.dumps({"tags": []}))  # name is required
    assert not accepts(answer, "Sure: " + json.dumps({"name": "x"}))  # the answer is the JSON, nothing else
    assert not accepts(answer, hermes_call("add", {"a": 1, "b": 2}))
    anything = answer_grammar({"type": "object"})  # json_object
    assert accepts(anything, json.dumps({"k": [1, None, {"z": "y"}]}))
    assert not accepts(anything, json.dumps([1]))
    with_tools = answer_grammar(schema, call=HermesToolParser().call_grammar([ADD, SEARCH]))
    assert accepts(with_tools, json.dumps({"name": "x"}))
    assert accepts(with_tools, hermes_call("add", {"a": 1, "b": 2}))
    assert not accepts(with_tools, hermes_call("add", {"a": 1}))
    assert not accepts(with_tools, "free text")
    with_xml = answer_grammar(schema, call=QwenXMLToolParser().call_grammar([ADD]))  # a grammar of other rules
    assert accepts(with_xml, _qwen_xml("add", {"a": "1", "b": "2"}))
    assert accepts(with_xml, json.dumps({"name": "x"}))
