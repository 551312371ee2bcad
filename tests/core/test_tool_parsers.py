"""Tool parsers: think-aware split, strict hermes JSON calls, schema-typed Qwen XML calls."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands.types.tools import ToolSpec

from tito_core.tool_parsers import (
    UNKNOWN_TOOL_NAME,
    HermesToolParser,
    ParsedOutput,
    QwenXMLToolParser,
    ToolCall,
    ToolParser,
    split_reasoning,
)

PARSERS = [HermesToolParser, QwenXMLToolParser]
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def hermes(name: str, arguments: Any, **dumps: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, **dumps) + "\n</tool_call>"


def qwen_value(value: Any) -> str:
    """Render a value as the Qwen3-Coder chat template does."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def qwen(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{qwen_value(v)}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def call_for(parser_cls: type, name: str, arguments: dict[str, Any]) -> str:
    return hermes(name, arguments) if parser_cls is HermesToolParser else qwen(name, arguments)


def spec(name: str, properties: dict[str, Any], **extra: Any) -> ToolSpec:
    return {
        "name": name,
        "description": f"{name} tool",
        "inputSchema": {"json": {"type": "object", "properties": properties, **extra}},
    }


def only_call(out: ParsedOutput) -> ToolCall:
    assert len(out.calls) == 1, out
    return out.calls[0]


def assert_malformed(call: ToolCall, error_part: str, name: str = UNKNOWN_TOOL_NAME) -> None:
    assert call.is_error
    assert call.error is not None and error_part in call.error, call.error
    assert "\n" not in call.error
    assert call.input == {}
    assert call.name == name
    assert call.id.startswith("call_")


# --- think-aware split, shared by every parser -------------------------------------------------------

DRAFT = "<tool_call>{rm -rf /}</tool_call>"


@pytest.mark.parametrize("parser_cls", PARSERS)
class TestReasoning:
    def test_protocol_and_name(self, parser_cls: type) -> None:
        parser = parser_cls()
        assert isinstance(parser, ToolParser)
        assert parser.name == {HermesToolParser: "hermes", QwenXMLToolParser: "qwen_xml"}[parser_cls]

    def test_plain_text(self, parser_cls: type) -> None:
        assert parser_cls().parse("  Hello, world.\n") == ParsedOutput(content="Hello, world.")

    def test_closed_think_block(self, parser_cls: type) -> None:
        text = "<think>\nLet me see.\nOK.\n</think>\n\n" + call_for(parser_cls, "ls", {"path": "/tmp"})
        out = parser_cls().parse(text)
        assert out.reasoning == "Let me see.\nOK."
        assert out.content == ""
        assert only_call(out).name == "ls"

    def test_draft_call_inside_think_is_not_returned(self, parser_cls: type) -> None:
        real = call_for(parser_cls, "ls", {"path": "."})
        draft = call_for(parser_cls, "rm", {"path": "/"})
        text = f"<think>\nMaybe {DRAFT} or {draft}? No.\n</think>\n\nListing.\n{real}"
        out = parser_cls().parse(text)
        assert [c.name for c in out.calls] == ["ls"]
        assert out.reasoning == f"Maybe {DRAFT} or {draft}? No."
        assert out.content == "Listing."

    def test_lone_think_end_makes_everything_before_it_reasoning(self, parser_cls: type) -> None:
        real = call_for(parser_cls, "ls", {"path": "."})
        draft = call_for(parser_cls, "rm", {"path": "/"})
        text = f"I could run {DRAFT} or {draft} no wait.\n</think>\n\n{real}"
        out = parser_cls().parse(text)
        assert [c.name for c in out.calls] == ["ls"]
        assert out.reasoning == f"I could run {DRAFT} or {draft} no wait."
        assert out.content == ""

    def test_lone_think_end_with_only_a_draft(self, parser_cls: type) -> None:
        out = parser_cls().parse(call_for(parser_cls, "rm", {"path": "/"}) + "</think>Done.")
        assert out.calls == []
        assert out.content == "Done."

    def test_unclosed_think_makes_the_rest_reasoning(self, parser_cls: type) -> None:
        draft = call_for(parser_cls, "rm", {"path": "/"})
        out = parser_cls().parse(f"Answer first.\n<think>\nthen {draft} and {DRAFT}")
        assert out.calls == []
        assert out.content == "Answer first."
        assert out.reasoning == f"then {draft} and {DRAFT}"

    def test_interleaved_think_blocks(self, parser_cls: type) -> None:
        a, b, c = (call_for(parser_cls, n, {"x": "1"}) for n in ("a", "b", "c"))
        text = f"<think>one {a}</think>{b}\n<think>\ntwo\n</think>\nthen {c}<think>{a}"
        out = parser_cls().parse(text)
        assert [call.name for call in out.calls] == ["b", "c"]
        assert out.reasoning == f"one {a}\n\ntwo\n\n{a}"
        assert out.content == "then"

    def test_empty_think_block_gives_no_reasoning(self, parser_cls: type) -> None:
        out = parser_cls().parse("<think>\n\n</think>\n\nHi")
        assert out.reasoning is None
        assert out.content == "Hi"

    def test_reasoning_keeps_inner_whitespace(self, parser_cls: type) -> None:
        out = parser_cls().parse("<think>\n  indented\n\n\tline \n</think>x")
        assert out.reasoning == "  indented\n\n\tline "

    def test_stray_think_end_after_a_block_is_content(self, parser_cls: type) -> None:
        out = parser_cls().parse("<think>r</think>a</think>b")
        assert out.reasoning == "r"
        assert out.content == "a</think>b"

    def test_think_start_inside_a_call_is_argument_text(self, parser_cls: type) -> None:
        out = parser_cls().parse(call_for(parser_cls, "echo", {"s": "<think> not reasoning"}))
        assert only_call(out).input == {"s": "<think> not reasoning"}
        assert out.reasoning is None

    @pytest.mark.parametrize("arg", ["</think>", "a</think>b", "</think><think>", "x</think>\n\n<tool_call>"])
    def test_think_markers_in_arguments_are_data(self, parser_cls: type, arg: str) -> None:
        # The template renders arguments verbatim; a `</think>` inside a call the model opened outside
        # reasoning is argument text, not a lone end of a pre-opened block (found by the rollout property).
        first, second = call_for(parser_cls, "echo", {"s": arg}), call_for(parser_cls, "echo", {"s": "2"})
        out = parser_cls().parse(f"{first}\n{second}")
        assert [call.input for call in out.calls] == [{"s": arg}, {"s": "2"}]
        assert [call.raw for call in out.calls] == [first, second]
        assert not any(call.is_error for call in out.calls)
        assert out.reasoning is None
        assert out.content == ""

    def test_lone_think_end_after_a_call_quoting_one(self, parser_cls: type) -> None:
        # the first `</think>` outside a call is the lone end: the call before it was drafted in reasoning
        draft = call_for(parser_cls, "rm", {"path": "</think>"})
        real = call_for(parser_cls, "ls", {"path": "."})
        out = parser_cls().parse(f"{draft} no.\n</think>\n\n{real}")
        assert [call.name for call in out.calls] == ["ls"]
        assert out.reasoning == f"{draft} no."

    def test_unclosed_call_before_a_lone_think_end_is_a_draft(self, parser_cls: type) -> None:
        out = parser_cls().parse("<tool_call>\nbroken </think> real")
        assert out == ParsedOutput(content="real", reasoning="<tool_call>\nbroken ")

    def test_prompt_opened_reasoning_runs_to_the_first_think_end(self, parser_cls: type) -> None:
        # The prompt pre-opened `<think>`: a draft call quoting `</think>` is reasoning up to that tag,
        # and nothing after the tag inside the draft is run either (it is not a call start).
        draft = call_for(parser_cls, "rm", {"path": "</think>"})
        real = call_for(parser_cls, "ls", {"path": "."})
        out = parser_cls().parse(f"<think> too? {draft}\n</think>\n\n{real}", reasoning_open=True)
        head = draft[: draft.index("</think>")]
        assert out.reasoning == f"<think> too? {head}".rstrip("\n")
        assert [call.name for call in out.calls] == ["ls"]

    def test_prompt_opened_reasoning_without_an_end_is_all_reasoning(self, parser_cls: type) -> None:
        draft = call_for(parser_cls, "rm", {"path": "/"})
        out = parser_cls().parse(f"\nthinking {draft}\n", reasoning_open=True)
        assert out == ParsedOutput(content="", reasoning=f"thinking {draft}")

    def test_unclosed_call_swallows_later_think(self, parser_cls: type) -> None:
        text = "<tool_call>\n<think>x</think> rest"
        call = only_call(parser_cls().parse(text))
        assert call.raw == text
        assert call.is_error

    def test_custom_delimiters(self, parser_cls: type) -> None:
        parser = parser_cls(
            think_start="<reasoning>", think_end="</reasoning>", tool_start="<call>", tool_end="</call>"
        )
        body = call_for(parser_cls, "f", {"a": "1"})
        body = body.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
        text = f"<reasoning><call>x</call></reasoning><think>kept</think>{body}"
        out = parser.parse(text)
        assert out.reasoning == "<call>x</call>"
        assert out.content == "<think>kept</think>"
        assert only_call(out).name == "f"
        assert only_call(out).raw == body

    @pytest.mark.parametrize(
        "kwargs", [{"think_start": ""}, {"tool_end": ""}, {"tool_start": "<x>", "tool_end": "<x>"}]
    )
    def test_bad_delimiters(self, parser_cls: type, kwargs: dict[str, str]) -> None:
        with pytest.raises(ValueError):
            parser_cls(**kwargs)

    def test_no_state_across_calls(self, parser_cls: type) -> None:
        parser = parser_cls()
        text = call_for(parser_cls, "f", {"a": "1"}) + call_for(parser_cls, "g", {"a": "2"})
        first, second = parser.parse(text), parser.parse(text)
        assert [c.name for c in first.calls] == [c.name for c in second.calls] == ["f", "g"]
        ids = {c.id for c in first.calls + second.calls}
        assert len(ids) == 4

    def test_thread_safe(self, parser_cls: type) -> None:
        parser = parser_cls()
        texts = [call_for(parser_cls, f"t{i}", {"a": str(i)}) for i in range(40)]
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(parser.parse, texts))
        assert [only_call(o).name for o in outs] == [f"t{i}" for i in range(40)]


def test_split_reasoning_without_tools_keeps_markup_in_content() -> None:
    split = split_reasoning("<think>r</think> a <tool_call>{}</tool_call>")
    assert split.reasoning == "r"
    assert split.content == "a <tool_call>{}</tool_call>"
    assert split.calls == []


def test_split_reasoning_finds_raw_calls() -> None:
    split = split_reasoning("a<t>x</t>b<t>y", tool_start="<t>", tool_end="</t>")
    assert split.content == "ab"
    assert [(c.raw, c.body, c.closed) for c in split.calls] == [("<t>x</t>", "x", True), ("<t>y", "y", False)]


def test_split_reasoning_needs_tool_end() -> None:
    with pytest.raises(ValueError):
        split_reasoning("x", tool_start="<t>")


# --- hermes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get", "arguments": {"city": "Paris", "days": 3}}</tool_call>',
        '<tool_call>\n{"name": "get", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        '<tool_call>  \n\t{"name":"get","arguments":{"city":"Paris","days":3}} \r\n </tool_call>',
        '<tool_call>\n{\n  "arguments": {\n    "days": 3,\n    "city": "Paris"\n  },\n  "name": "get"\n}\n</tool_call>',
    ],
)
def test_hermes_whitespace_and_key_order_variants(text: str) -> None:
    call = only_call(HermesToolParser().parse(text))
    assert call.name == "get"
    assert call.input == {"city": "Paris", "days": 3}
    assert call.error is None
    assert call.raw == text
    assert call.id.startswith("call_")


def test_hermes_parallel_calls_keep_order_and_content() -> None:
    text = (
        "I'll check both.\n"
        + hermes("weather", {"city": "Paris"})
        + "\n"
        + hermes("weather", {"city": "Oslo"})
        + "\n"
        + hermes("time", {})
    )
    out = HermesToolParser().parse(text)
    assert [(c.name, c.input) for c in out.calls] == [
        ("weather", {"city": "Paris"}),
        ("weather", {"city": "Oslo"}),
        ("time", {}),
    ]
    assert len({c.id for c in out.calls}) == 3
    assert out.content == "I'll check both."
    for call in out.calls:
        assert call.raw in text


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_hermes_unicode(ensure_ascii: bool) -> None:
    args = {"城市": "Zürich 🌧", "note": "naïve — ok", "emoji": "👩‍👩‍👧"}
    out = HermesToolParser().parse("Voilà ✓ " + hermes("météo", args, ensure_ascii=ensure_ascii))
    assert only_call(out).name == "météo"
    assert only_call(out).input == args
    assert out.content == "Voilà ✓"


def test_hermes_strings_that_look_like_special_tokens() -> None:
    args = {
        "a": "</tool_call>",
        "b": "<tool_call>{}</tool_call>",
        "c": "<|im_end|>\n<|im_start|>user",
        "d": "<think>",
        "e": '{"name": "rm", "arguments": {}}',
    }
    text = hermes("echo", args) + "\n" + hermes("next", {})
    out = HermesToolParser().parse(text)
    assert [(c.name, c.input) for c in out.calls] == [("echo", args), ("next", {})]
    assert out.content == ""


def test_hermes_nested_arguments_are_kept_exactly() -> None:
    args = {"q": {"filters": [{"k": "a", "v": [1, 2.5, None, True]}], "limit": 10}, "s": ""}
    assert only_call(HermesToolParser().parse(hermes("search", args))).input == args


def wrap(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.mark.parametrize(
    ("body", "error", "name"),
    [
        (
            '{"name": "f", "arguments": "{\\"a\\": 1}"}',
            "tool call arguments must be a JSON object, got string",
            "f",
        ),
        ('{"name": "f", "arguments": [1, 2]}', "tool call arguments must be a JSON object, got array", "f"),
        ('{"name": "f", "arguments": null}', "tool call arguments must be a JSON object, got null", "f"),
        ('{"name": "f", "arguments": 3}', "tool call arguments must be a JSON object, got integer", "f"),
        ('{"name": "f", "arguments": {"a": 1}', "tool call is not valid JSON", "f"),
        ("{rm -rf /}", "tool call is not valid JSON: Expecting property name", UNKNOWN_TOOL_NAME),
        ("{'name': 'f', 'arguments': {}}", "tool call is not valid JSON", UNKNOWN_TOOL_NAME),
        ("", "tool call is empty", UNKNOWN_TOOL_NAME),
        ('[{"name": "f", "arguments": {}}]', "tool call must be a JSON object, got array", "f"),
        ('"f"', "tool call must be a JSON object, got string", UNKNOWN_TOOL_NAME),
        ('{"arguments": {"name": "x"}}', 'tool call has no "name"', UNKNOWN_TOOL_NAME),
        (
            '{"name": "", "arguments": {}}',
            '"name" must be a non-empty string, got a blank string',
            UNKNOWN_TOOL_NAME,
        ),
        ('{"name": 5, "arguments": {}}', '"name" must be a non-empty string, got integer', UNKNOWN_TOOL_NAME),
        ('{"name": "f"}', 'tool call has no "arguments"', "f"),
        ('{"name": "f", "parameters": {"a": 1}}', 'unexpected key(s) "parameters"', "f"),
        ('{"name": "f", "arguments": {}, "id": "1"}', 'unexpected key(s) "id"', "f"),
        ('{"name": "f", "arguments": {"x": NaN}}', "NaN is not valid JSON", "f"),
        ('{"name": "f", "arguments": {"x": -Infinity}}', "-Infinity is not valid JSON", "f"),
        ('{"name": "f", "arguments": {"a": 1, "a": 2}}', 'duplicate key "a"', "f"),
        ('{"name": "f", "name": "g", "arguments": {}}', 'duplicate key "name"', "f"),
        ('{"name": "f", "arguments": {}} trailing', "tool call is not valid JSON: Extra data", "f"),
        ('{"name": "f", "arguments": {}}\n{"name": "g", "arguments": {}}', "Extra data", "f"),
        ("[" * 100_000, "tool call is not valid JSON", UNKNOWN_TOOL_NAME),
    ],
)
def test_hermes_malformed(body: str, error: str, name: str) -> None:
    text = "Calling.\n" + wrap(body) + "\nafter"
    out = HermesToolParser().parse(text)
    call = only_call(out)
    assert_malformed(call, error, name)
    assert call.raw == wrap(body)
    assert out.content == "Calling.\n\nafter"


def test_hermes_unclosed_call_is_malformed_with_the_rest_as_raw() -> None:
    good = hermes("a", {"x": 1})
    tail = '<tool_call>\n{"name": "b", "arguments": {"x": '
    out = HermesToolParser().parse(f"Text {good}\n{tail}")
    assert [c.name for c in out.calls] == ["a", "b"]
    assert out.calls[0].error is None
    assert_malformed(out.calls[1], "tool call is not closed: no </tool_call> before the end of the output", "b")
    assert out.calls[1].raw == tail
    assert out.content == "Text"


def test_hermes_unclosed_after_complete_json() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}'
    call = only_call(HermesToolParser().parse(text))
    assert_malformed(call, "is not closed", "f")
    assert call.raw == text


def test_hermes_malformed_then_valid_keep_order() -> None:
    text = wrap('{"name": "bad", "arguments": "x"}') + wrap('{"name": "good", "arguments": {}}')
    out = HermesToolParser().parse(text)
    assert [(c.name, c.is_error) for c in out.calls] == [("bad", True), ("good", False)]


def test_hermes_allow_missing_arguments() -> None:
    call = only_call(HermesToolParser(allow_missing_arguments=True).parse(wrap('{"name": "now"}')))
    assert (call.name, call.input, call.error) == ("now", {}, None)


def test_hermes_stray_end_tag_and_bare_json_are_content() -> None:
    out = HermesToolParser().parse('done </tool_call> {"name": "f", "arguments": {}}')
    assert out.calls == []
    assert out.content == 'done </tool_call> {"name": "f", "arguments": {}}'


def test_hermes_ignores_tools_argument() -> None:
    tools = [spec("f", {"a": {"type": "string"}})]
    assert only_call(HermesToolParser().parse(hermes("f", {"a": 1}), tools)).input == {"a": 1}


# --- qwen_xml ----------------------------------------------------------------------------------------

TYPED = spec(
    "f",
    {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "o": {"type": "object"},
        "a": {"type": "array", "items": {"type": "integer"}},
        "z": {"type": "null"},
        "int_or_str": {"type": ["integer", "string"]},
        "str_or_int": {"type": ["string", "integer"]},
        "opt_int": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "color": {"enum": ["red", "green"]},
        "level": {"enum": [1, 2, 3]},
        "ref": {"$ref": "#/$defs/Point"},
        "free": {"description": "no type"},
    },
    **{"$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}}},
)


def xml(params: list[tuple[str, str]], name: str = "f") -> str:
    return qwen(name, dict(params))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("s", "123", "123"),
        ("s", "007", "007"),
        ("s", "true", "true"),
        ("s", "null", "null"),
        ("s", '{"a": 1}', '{"a": 1}'),
        ("s", "  spaced  ", "  spaced  "),
        ("s", "", ""),
        ("i", "123", 123),
        ("i", "-42", -42),
        ("i", " 7 ", 7),
        ("n", "2", 2),
        ("n", "-1.5", -1.5),
        ("n", "1e3", 1000.0),
        ("b", "true", True),
        ("b", "False", False),
        ("b", "TRUE", True),
        ("o", '{"k": [1, "v"]}', {"k": [1, "v"]}),
        ("a", "[1, 2, 3]", [1, 2, 3]),
        ("z", "null", None),
        ("z", "None", None),
        ("int_or_str", "12", 12),
        ("int_or_str", "twelve", "twelve"),
        ("str_or_int", "12", "12"),
        ("opt_int", "5", 5),
        ("opt_int", "None", None),
        ("color", "red", "red"),
        ("level", "2", 2),
        ("ref", '{"x": 1.5}', {"x": 1.5}),
        ("free", "42", "42"),
        ("undeclared", "42", "42"),
    ],
)
def test_qwen_xml_typing(key: str, value: str, expected: Any) -> None:
    call = only_call(QwenXMLToolParser().parse(xml([(key, value)]), [TYPED]))
    assert call.error is None, call.error
    assert call.input == {key: expected}
    assert type(call.input[key]) is type(expected)


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("i", "12a", 'parameter "i": expected integer, got "12a"'),
        ("i", "1.0", "expected integer"),
        ("i", "", "expected integer"),
        ("i", "١٢", "expected integer"),
        ("i", "1_000", "expected integer"),
        ("n", "nan", "expected number"),
        ("n", "inf", "expected number"),
        ("n", "1e999", "expected number"),
        ("b", "yes", 'parameter "b": expected boolean, got "yes"'),
        ("o", "[1]", 'expected object, got "[1]" (got a JSON array)'),
        ("o", "{'a': 1}", "expected object"),
        ("o", '{"a": 1, "a": 2}', '(duplicate key "a")'),
        ("a", '{"a": 1}', "(got a JSON object)"),
        ("z", "nil", "expected null"),
        ("opt_int", "x", "expected integer or null"),
    ],
)
def test_qwen_xml_bad_values(key: str, value: str, error: str) -> None:
    text = xml([(key, value)])
    call = only_call(QwenXMLToolParser().parse(text, [TYPED]))
    assert_malformed(call, error, "f")
    assert call.error is not None and call.error.startswith('invalid arguments for "f": ')
    assert call.raw == text


def test_qwen_xml_reports_every_bad_value() -> None:
    call = only_call(QwenXMLToolParser().parse(xml([("i", "x"), ("s", "ok"), ("b", "maybe")]), [TYPED]))
    assert call.error == (
        'invalid arguments for "f": parameter "i": expected integer, got "x"; '
        'parameter "b": expected boolean, got "maybe"'
    )


def test_qwen_xml_error_message_is_short_and_one_line() -> None:
    call = only_call(QwenXMLToolParser().parse(xml([("i", "x\n" * 500)]), [TYPED]))
    assert call.error is not None and "\n" not in call.error and len(call.error) < 200


def test_qwen_xml_string_strips_exactly_one_newline_each_side() -> None:
    code = "\n\ndef f():\n    return '</function>'\n\n"
    text = f"<tool_call>\n<function=write>\n<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>"
    out = QwenXMLToolParser().parse(text, [spec("write", {"code": {"type": "string"}})])
    assert only_call(out).input == {"code": code}
    compact = "<tool_call><function=write><parameter=code>x</parameter></function></tool_call>"
    assert only_call(QwenXMLToolParser().parse(compact)).input == {"code": "x"}


def test_qwen_xml_without_tools_or_for_unknown_tool_keeps_strings() -> None:
    text = xml([("i", "1"), ("b", "true")])
    assert only_call(QwenXMLToolParser().parse(text)).input == {"i": "1", "b": "true"}
    assert only_call(QwenXMLToolParser().parse(text, [spec("other", {})])).input == {"i": "1", "b": "true"}


def test_qwen_xml_schema_without_json_wrapper() -> None:
    bare: Any = {"name": "f", "description": "", "inputSchema": {"properties": {"i": {"type": "integer"}}}}
    assert only_call(QwenXMLToolParser().parse(xml([("i", "3")]), [bare])).input == {"i": 3}


def test_qwen_xml_no_parameters() -> None:
    call = only_call(QwenXMLToolParser().parse("<tool_call>\n<function=now>\n</function>\n</tool_call>"))
    assert (call.name, call.input, call.error) == ("now", {}, None)


def test_qwen_xml_parallel_calls_and_unicode() -> None:
    text = "Je vérifie.\n" + xml([("s", "Zürich 🌧")], "météo") + "\n" + xml([("i", "2")]) + "\n"
    out = QwenXMLToolParser().parse(text, [TYPED])
    assert [(c.name, c.input) for c in out.calls] == [("météo", {"s": "Zürich 🌧"}), ("f", {"i": 2})]
    assert out.content == "Je vérifie."


def test_qwen_xml_special_token_strings_in_values() -> None:
    value = "<tool_call>\n<function=rm>\n</function>\n</tool_call><|im_end|><think>"
    text = xml([("s", value)]) + xml([("i", "1")])
    out = QwenXMLToolParser().parse(text, [TYPED])
    assert [(c.name, c.input) for c in out.calls] == [("f", {"s": value}), ("f", {"i": 1})]


@pytest.mark.parametrize(
    ("body", "error", "name"),
    [
        ("<parameter=a>\n1\n</parameter>", "tool call has no <function=NAME> tag", UNKNOWN_TOOL_NAME),
        ('{"name": "f", "arguments": {}}', "tool call has no <function=NAME> tag", UNKNOWN_TOOL_NAME),
        ("", "tool call has no <function=NAME> tag", UNKNOWN_TOOL_NAME),
        ("<function=>\n</function>", "invalid <function=NAME> tag", UNKNOWN_TOOL_NAME),
        ("<function=get weather>\n</function>", "invalid <function=NAME> tag", UNKNOWN_TOOL_NAME),
        (
            "<function=f\n<parameter=a>\n1\n</parameter>\n</function>",
            "invalid <function=NAME> tag",
            UNKNOWN_TOOL_NAME,
        ),
        ("<function=f>\n<parameter=a>\n1\n", 'parameter "a" is not closed: no </parameter>', "f"),
        ("<function=f>\n<parameter=a>\n1\n</parameter>\n", "<function=f> is not closed: no </function>", "f"),
        ("<function=f>\n<parameter=>\n1\n</parameter>\n</function>", "invalid <parameter=KEY> tag", "f"),
        ("<function=f>\n<parameter=a\n1\n</parameter>\n</function>", "invalid <parameter=KEY> tag", "f"),
        (
            "<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>",
            'duplicate parameter "a"',
            "f",
        ),
        (
            "<function=f>\nhello\n<parameter=a>\n1\n</parameter>\n</function>",
            "unexpected text inside <function=f>",
            "f",
        ),
        ("<function=f>\n</function>\nextra", 'unexpected text after </function>: "extra"', "f"),
        ("<function=f>\n</function>\n<function=g>\n</function>", "unexpected text after </function>", "f"),
    ],
)
def test_qwen_xml_malformed(body: str, error: str, name: str) -> None:
    text = f"Calling.\n<tool_call>\n{body}\n</tool_call>\nafter"
    out = QwenXMLToolParser().parse(text, [TYPED])
    call = only_call(out)
    assert_malformed(call, error, name)
    assert call.raw == f"<tool_call>\n{body}\n</tool_call>"
    assert out.content == "Calling.\n\nafter"


def test_qwen_xml_unclosed_call() -> None:
    tail = "<tool_call>\n<function=f>\n<parameter=s>\nhalf"
    out = QwenXMLToolParser().parse(xml([("i", "1")]) + "\n" + tail, [TYPED])
    assert [c.name for c in out.calls] == ["f", "f"]
    assert out.calls[0].input == {"i": 1}
    assert_malformed(out.calls[1], "tool call is not closed: no </tool_call> before the end of the output", "f")
    assert out.calls[1].raw == tail


def test_qwen_xml_end_tag_inside_a_value_of_a_truncated_call() -> None:
    # Structure reads to </function> but no end tag follows: the call is unclosed, not cut at the value.
    text = "<tool_call>\n<function=f>\n<parameter=s>\n</tool_call>\n</parameter>\n</function>\n"
    call = only_call(QwenXMLToolParser().parse(text, [TYPED]))
    assert_malformed(call, "is not closed", "f")
    assert call.raw == text


# --- properties ----------------------------------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<function=f>",
    "<parameter=i>",
    "<|im_end|>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": ',
    '"arguments"',
    "{",
    "}",
    "[",
    '"',
    "\\",
    "\n",
    " ",
    ">",
    "NaN",
    "123",
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    "<tool_call>\n<function=f>\n<parameter=i>\n1\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n",
    "\n</parameter>\n</function>\n</tool_call>",
    '<tool_call>{"name": "g", "arguments": ',
    "}}</tool_call>",
]

safe_text = st.text(max_size=20).filter(lambda s: "</think>" not in s)
special_text = st.sampled_from(["<tool_call>", "</tool_call>", "<think>", "<|im_end|>", "</parameter>"])
json_strings = st.one_of(safe_text, special_text)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_strings,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_strings, inner, max_size=4),
    max_leaves=12,
)
arguments = st.dictionaries(json_strings, json_values, max_size=5)
names = safe_text.filter(lambda s: bool(s.strip()))
separators = st.sampled_from(["", "\n", "\n\n", " text between "])
dumps_kwargs = st.sampled_from(
    [{}, {"separators": (",", ":")}, {"ensure_ascii": False}, {"indent": 2, "ensure_ascii": False}]
)
fragment_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=30).map("".join)


@PROPS
@given(
    calls=st.lists(st.tuples(names, arguments), max_size=4),
    dumps=dumps_kwargs,
    sep=separators,
    think=st.sampled_from(["", "<think>\nplan\n</think>\n\n", "plan\n</think>\n\n"]),
)
def test_hermes_round_trip(
    calls: list[tuple[str, dict[str, Any]]], dumps: dict[str, Any], sep: str, think: str
) -> None:
    rendered = [hermes(name, args, **dumps) for name, args in calls]
    text = think + sep.join(rendered)
    out = HermesToolParser().parse(text)
    assert [(c.name, c.input, c.error) for c in out.calls] == [(n, a, None) for n, a in calls]
    assert [c.raw for c in out.calls] == rendered
    assert all(c.raw in text for c in out.calls)
    assert out.reasoning == ("plan" if think else None)


qwen_keys = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), exclude_characters="<>"),
    min_size=1,
    max_size=10,
).filter(lambda s: not any(ch.isspace() for ch in s))
qwen_names = qwen_keys
qwen_strings = st.text(max_size=30).filter(lambda s: "</parameter>" not in s and "</think>" not in s)
qwen_json = json_values.filter(lambda v: "</parameter>" not in json.dumps(v, ensure_ascii=False))
qwen_typed = st.one_of(
    st.tuples(st.just({"type": "string"}), qwen_strings),
    st.tuples(st.just({"type": "integer"}), st.integers()),
    st.tuples(st.just({"type": "number"}), st.floats(allow_nan=False, allow_infinity=False)),
    st.tuples(st.just({"type": "boolean"}), st.booleans()),
    st.tuples(st.just({"type": "object"}), st.dictionaries(safe_text, qwen_json, max_size=3)),
    st.tuples(st.just({"type": "array"}), st.lists(qwen_json, max_size=3)),
    st.tuples(st.just({"anyOf": [{"type": "integer"}, {"type": "null"}]}), st.none() | st.integers()),
)


@PROPS
@given(
    calls=st.lists(st.tuples(qwen_names, st.dictionaries(qwen_keys, qwen_typed, max_size=4)), max_size=3),
    sep=separators,
)
def test_qwen_xml_round_trip(calls: list[tuple[str, dict[str, tuple[dict[str, Any], Any]]]], sep: str) -> None:
    tools: list[ToolSpec] = []
    expected = []
    rendered = []
    for i, (name, params) in enumerate(calls):
        unique = f"{name}_{i}"
        tools.append(spec(unique, {k: schema for k, (schema, _) in params.items()}))
        args = {k: value for k, (_, value) in params.items()}
        expected.append((unique, args, None))
        rendered.append(qwen(unique, args))
    out = QwenXMLToolParser().parse(sep.join(rendered), tools)
    assert [(c.name, c.input, c.error) for c in out.calls] == expected
    assert [c.raw for c in out.calls] == rendered


@pytest.mark.parametrize("parser_cls", PARSERS)
@PROPS
@given(text=fragment_text)
def test_parse_never_raises(parser_cls: type, text: str) -> None:
    out = parser_cls().parse(text, [TYPED])
    for call in out.calls:
        assert call.raw in text
        assert call.id.startswith("call_")
        if call.error is None:
            assert isinstance(call.input, dict)
        else:
            assert isinstance(call.error, str) and call.error and "\n" not in call.error
            assert call.input == {}


@pytest.mark.parametrize("parser_cls", PARSERS)
@PROPS
@given(reasoning=fragment_text.filter(lambda s: "<think>" not in s and "</think>" not in s), tail=st.booleans())
def test_calls_inside_reasoning_never_returned(parser_cls: type, reasoning: str, tail: bool) -> None:
    parser = parser_cls()
    suffix = "\n</think>\n\ndone" if tail else ""
    for text in (f"<think>{reasoning}</think>", f"{reasoning}</think>", f"<think>{reasoning}{suffix}"):
        assert parser.parse(text, [TYPED]).calls == []
