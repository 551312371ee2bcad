"""Tool parsers beyond Qwen: Llama 3 JSON, Mistral, GLM, Kimi-K2, DeepSeek V3.x, gpt-oss (harmony).

Each format is checked on outputs written the way the family's official chat template renders calls
(single, parallel, malformed, inside reasoning, unicode, empty arguments), plus name-based lookup and
parser inference from a tokenizer.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strands.types.tools import ToolSpec

from tito_core.errors import ConfigError
from tito_core.plugins import get_tool_parser
from tito_core.tool_parsers import (
    UNKNOWN_TOOL_NAME,
    DeepSeekV3ToolParser,
    Gemma4ToolParser,
    GLMToolParser,
    GptOssToolParser,
    KimiK2ToolParser,
    Llama3JSONToolParser,
    MistralToolParser,
    ParsedOutput,
    ToolParser,
    infer_tool_parser,
)

ARGS: dict[str, Any] = {"city": "Zürich 東京 🙂", "days": 3, "units": None, "tags": ["a", "b"]}


def tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def only_ok(out: ParsedOutput) -> list[tuple[str, dict[str, Any]]]:
    assert all(c.error is None for c in out.calls), out
    return [(c.name, c.input) for c in out.calls]


# -- renderers of each format, as the official templates write calls ------------------------------------


def llama3(name: str, args: dict[str, Any]) -> str:
    return '{"name": "' + name + '", "parameters": ' + tojson(args) + "}"


def mistral_v3(calls: list[tuple[str, dict[str, Any]]]) -> str:
    items = [{"name": n, "arguments": a, "id": f"abc{i:06d}"} for i, (n, a) in enumerate(calls)]
    return "[TOOL_CALLS]" + tojson(items)


def mistral_v11(calls: list[tuple[str, dict[str, Any]]], with_id: bool = True) -> str:
    return "".join(
        f"[TOOL_CALLS]{n}" + (f"[CALL_ID]id{i:07d}" if with_id else "") + f"[ARGS]{tojson(a)}"
        for i, (n, a) in enumerate(calls)
    )


def glm(name: str, args: dict[str, Any]) -> str:
    pairs = "".join(
        f"\n<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else tojson(v)}</arg_value>"
        for k, v in args.items()
    )
    return f"<tool_call>{name}{pairs}\n</tool_call>"


def kimi(calls: list[tuple[str, dict[str, Any]]]) -> str:
    inner = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{tojson(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


def deepseek_v31(calls: list[tuple[str, dict[str, Any]]]) -> str:
    inner = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{tojson(a)}<｜tool▁call▁end｜>" for n, a in calls)
    return f"<｜tool▁calls▁begin｜>{inner}<｜tool▁calls▁end｜>"


def deepseek_v32(calls: list[tuple[str, dict[str, Any]]]) -> str:
    out = "\n\n<｜DSML｜function_calls>\n"
    for name, args in calls:
        out += f'<｜DSML｜invoke name="{name}">\n'
        for k, v in args.items():
            flag = "true" if isinstance(v, str) else "false"
            value = v if isinstance(v, str) else tojson(v)
            out += f'<｜DSML｜parameter name="{k}" string="{flag}">{value}</｜DSML｜parameter>\n'
        out += "</｜DSML｜invoke>\n"
    return out + "</｜DSML｜function_calls>"


def harmony(name: str, args: dict[str, Any], *, stop: str = "") -> str:
    return (
        f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{tojson(args)}{stop}"
    )


SCHEMA: list[ToolSpec] = [
    {
        "name": "weather",
        "description": "weather",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "units": {"type": ["string", "null"]},
                    "tags": {"type": "array"},
                },
            }
        },
    }
]


# -- registry and inference ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("llama3_json", Llama3JSONToolParser),
        ("mistral", MistralToolParser),
        ("glm", GLMToolParser),
        ("kimi_k2", KimiK2ToolParser),
        ("deepseek_v3", DeepSeekV3ToolParser),
        ("gpt_oss", GptOssToolParser),
    ],
)
def test_registered_by_name(name: str, cls: type) -> None:
    parser = get_tool_parser(name)
    assert isinstance(parser, cls)
    assert isinstance(parser, ToolParser)
    assert parser.name == name


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ '<|start|>assistant<|channel|>final<|message|>' }}", "gpt_oss"),
        ("<|tool_calls_section_begin|>{{ x }}", "kimi_k2"),
        ("{{ '<｜tool▁calls▁begin｜>' }}", "deepseek_v3"),
        ("{{ '<｜DSML｜function_calls>' }}", "deepseek_v3"),
        ("<tool_call>{{ name }}<arg_key>k</arg_key>", "glm"),
        ("<tool_call>\n<function={{ name }}>", "qwen_xml"),
        ("<tool_call>{{ call | tojson }}</tool_call>", "hermes"),
        ("[TOOL_CALLS]{{ calls }}", "mistral"),
        ("<|python_tag|>{{ code }}", "llama3_json"),
        ('<|start_header_id|>ipython<|end_header_id|> {"name": x, "parameters": y}', "llama3_json"),
    ],
)
def test_infer_from_template(template: str, expected: str) -> None:
    assert infer_tool_parser(SimpleNamespace(chat_template=template)) == expected


def test_infer_from_special_tokens_when_the_template_says_nothing() -> None:
    tokenizer = SimpleNamespace(
        chat_template=None, added_tokens_decoder={5: SimpleNamespace(content="[TOOL_CALLS]")}, all_special_tokens=[]
    )
    assert infer_tool_parser(tokenizer) == "mistral"


def test_infer_from_a_template_dict() -> None:
    assert infer_tool_parser(SimpleNamespace(chat_template={"default": "x", "tool_use": "<tool_call>"})) == "hermes"


def test_infer_fails_with_what_it_looked_for() -> None:
    with pytest.raises(ConfigError) as info:
        infer_tool_parser(SimpleNamespace(chat_template="{{ messages }}"))
    message = str(info.value)
    assert "<tool_call>" in message and "[TOOL_CALLS]" in message and "<|channel|>" in message
    assert "tool_parser=" in message


def test_infer_on_the_real_qwen_tokenizer(qwen3_tokenizer: Any) -> None:
    assert infer_tool_parser(qwen3_tokenizer) == "hermes"


# -- llama3_json -----------------------------------------------------------------------------------------


def test_llama3_bare_and_python_tag() -> None:
    parser = Llama3JSONToolParser()
    assert only_ok(parser.parse(llama3("weather", ARGS))) == [("weather", ARGS)]
    out = parser.parse("Let me check.<|python_tag|>" + llama3("weather", ARGS))
    assert out.content == "Let me check."
    assert only_ok(out) == [("weather", ARGS)]
    assert out.calls[0].raw == "<|python_tag|>" + llama3("weather", ARGS)


def test_llama3_parallel_and_empty_parameters() -> None:
    text = llama3("a", {}) + "; " + llama3("b", {"x": 1})
    out = Llama3JSONToolParser().parse(text)
    assert only_ok(out) == [("a", {}), ("b", {"x": 1})]
    assert out.calls[1].raw == llama3("b", {"x": 1})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "f", "arguments": {}}', 'unexpected key(s) "arguments"'),
        ('{"name": "f"}', 'no "parameters"'),
        ('{"name": "f", "parameters": [1]}', "must be a JSON object, got array"),
        ('{"name": "f", "parameters": {"a": 1}', "not valid JSON"),
        ('<|python_tag|>brave_search.call(query="x")', "not a JSON object"),
        ("<|python_tag|>", "empty"),
        ('{"name": "f", "parameters": {}} trailing', "not a JSON object"),
    ],
)
def test_llama3_malformed_keeps_raw(text: str, error: str) -> None:
    out = Llama3JSONToolParser().parse(text)
    assert out.calls and out.calls[-1].error is not None and error in out.calls[-1].error
    assert "".join(c.raw for c in out.calls).replace(" ", "") in text.replace(" ", "")
    assert out.calls[-1].input == {}


def test_llama3_plain_text_and_bare_json_off() -> None:
    assert Llama3JSONToolParser().parse("The answer is 4.").calls == []
    out = Llama3JSONToolParser(bare_json=False).parse('{"answer": 4}')
    assert out.calls == [] and out.content == '{"answer": 4}'


def test_llama3_calls_inside_reasoning_do_not_run() -> None:
    out = Llama3JSONToolParser().parse("<think><|python_tag|>" + llama3("f", {}) + "</think>Done.")
    assert out.calls == [] and out.content == "Done." and out.reasoning is not None


# -- mistral -----------------------------------------------------------------------------------------------


def test_mistral_v3_list_with_ids() -> None:
    calls = [("weather", ARGS), ("noop", {})]
    out = MistralToolParser().parse(mistral_v3(calls))
    assert only_ok(out) == calls
    assert [c.id for c in out.calls] == ["abc000000", "abc000001"]
    assert all(c.raw == mistral_v3(calls) for c in out.calls)


@pytest.mark.parametrize("with_id", [True, False])
def test_mistral_v11_args_layout(with_id: bool) -> None:
    calls = [("weather", ARGS), ("noop", {})]
    out = MistralToolParser().parse("Checking." + mistral_v11(calls, with_id))
    assert out.content == "Checking."
    assert only_ok(out) == calls
    if with_id:
        assert [c.id for c in out.calls] == ["id0000000", "id0000001"]
    assert out.calls[1].raw == "[TOOL_CALLS]noop" + ("[CALL_ID]id0000001" if with_id else "") + "[ARGS]{}"


@pytest.mark.parametrize(
    ("text", "error", "name"),
    [
        ("[TOOL_CALLS]", "nothing after", UNKNOWN_TOOL_NAME),
        ('[TOOL_CALLS][{"name": "f"}]', "arguments must be a JSON object, got nothing", "f"),
        ('[TOOL_CALLS][{"name": "f", "arguments": "{}"}]', "got string", "f"),
        ('[TOOL_CALLS]{"name": "f", "arguments": {}}', "no [ARGS]", "f"),
        ('[TOOL_CALLS]f[ARGS]{"a": 1', "not valid JSON", "f"),
        ("[TOOL_CALLS]f[ARGS][1]", "must be a JSON object", "f"),
        ("[TOOL_CALLS]bad name[ARGS]{}", "invalid tool name", UNKNOWN_TOOL_NAME),
        ('[TOOL_CALLS][{"name": "f", "arguments": {}, "extra": 1}]', "unexpected key", "f"),
    ],
)
def test_mistral_malformed(text: str, error: str, name: str) -> None:
    out = MistralToolParser().parse(text)
    assert len(out.calls) == 1
    call = out.calls[0]
    assert call.error is not None and error in call.error, call.error
    assert call.name == name and call.raw == text and call.input == {}


def test_mistral_think_blocks_hide_calls() -> None:
    out = MistralToolParser().parse("[THINK]draft " + mistral_v11([("f", {})]) + "[/THINK]Answer.")
    assert out.calls == [] and out.content == "Answer." and out.reasoning is not None


def test_mistral_malformed_then_valid_keep_order() -> None:
    out = MistralToolParser().parse("[TOOL_CALLS]f[ARGS]{oops}[TOOL_CALLS]g[ARGS]{}")
    assert [(c.name, c.is_error) for c in out.calls] == [("f", True), ("g", False)]


# -- glm ---------------------------------------------------------------------------------------------------


def test_glm_typed_by_schema() -> None:
    out = GLMToolParser().parse("<think>plan</think>\n" + glm("weather", ARGS), SCHEMA)
    assert only_ok(out) == [("weather", ARGS)]
    assert out.reasoning == "plan"


def test_glm_without_schema_keeps_strings_and_no_args() -> None:
    out = GLMToolParser().parse(glm("weather", {"days": 3}) + glm("noop", {}))
    assert only_ok(out) == [("weather", {"days": "3"}), ("noop", {})]


def test_glm_parallel_and_special_text_in_values() -> None:
    args = {"city": "a </tool_call> <think> b"}
    out = GLMToolParser().parse("Sure.\n" + glm("weather", args) + glm("weather", {"city": ""}), SCHEMA)
    assert only_ok(out) == [("weather", args), ("weather", {"city": ""})]
    assert out.content == "Sure."


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "no name"),
        ("<tool_call>weather\n<arg_key>days</arg_key><arg_value>three</arg_value></tool_call>", "expected integer"),
        ("<tool_call>weather\n<arg_key>a</arg_key>1</tool_call>", "has no <arg_value>"),
        (
            "<tool_call>weather\n<arg_key>a</arg_key><arg_value>1</arg_value>"
            "<arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
            "duplicate",
        ),
        ("<tool_call>weather\nstray<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "invalid tool name"),
        ("<tool_call>weather\n<arg_key>a</arg_key><arg_value>1</arg_value>", "not closed"),
    ],
)
def test_glm_malformed(body: str, error: str) -> None:
    out = GLMToolParser().parse(body, SCHEMA)
    assert len(out.calls) == 1 and out.calls[0].error is not None and error in out.calls[0].error, out
    assert out.calls[0].raw == body


def test_glm_calls_inside_reasoning_do_not_run() -> None:
    out = GLMToolParser().parse("draft " + glm("f", {}) + "</think>Final.")
    assert out.calls == [] and out.content == "Final."


# -- kimi_k2 ------------------------------------------------------------------------------------------------


def test_kimi_parallel_keeps_generated_ids_and_order() -> None:
    calls = [(f"t{i}", {"i": i}) for i in range(12)]
    out = KimiK2ToolParser().parse("On it." + kimi(calls))
    assert out.content == "On it."
    assert only_ok(out) == calls
    # generated order, not string order ("functions.t10:10" < "functions.t2:2" as strings)
    assert [c.id for c in out.calls] == [f"functions.t{i}:{i}" for i in range(12)]


def test_kimi_unicode_and_empty_arguments() -> None:
    out = KimiK2ToolParser().parse(kimi([("weather", ARGS), ("noop", {})]))
    assert only_ok(out) == [("weather", ARGS), ("noop", {})]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (kimi([("f", {})]).replace("functions.f:0", "f"), "invalid tool-call id"),
        (kimi([("f", {})]).replace("{}", "{'a': 1}"), "not valid JSON"),
        (kimi([("f", {}), ("f", {})]).replace(":1", ":0"), "duplicate tool-call id"),
        (kimi([("f", {})]).removesuffix("<|tool_calls_section_end|>"), "not closed"),
        ("<|tool_calls_section_begin|>junk<|tool_calls_section_end|>", "unexpected text"),
        ("<|tool_calls_section_begin|><|tool_calls_section_end|>", "holds no call"),
    ],
)
def test_kimi_malformed(text: str, error: str) -> None:
    out = KimiK2ToolParser().parse(text)
    assert out.calls and any(c.error is not None and error in c.error for c in out.calls), out


def test_kimi_thinking_hides_calls() -> None:
    out = KimiK2ToolParser().parse("<think>maybe " + kimi([("f", {})]) + "</think>No tools needed.")
    assert out.calls == [] and out.content == "No tools needed."


# -- deepseek_v3 ---------------------------------------------------------------------------------------------


def test_deepseek_v31_parallel() -> None:
    calls = [("weather", ARGS), ("noop", {})]
    out = DeepSeekV3ToolParser().parse("</think>Let me look." + deepseek_v31(calls))
    assert only_ok(out) == calls
    assert out.content == "Let me look."


def test_deepseek_v3_original_fenced_layout() -> None:
    text = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n"
        + tojson(ARGS)
        + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    assert only_ok(DeepSeekV3ToolParser().parse(text)) == [("weather", ARGS)]


def test_deepseek_v32_dsml() -> None:
    calls = [("weather", ARGS), ("noop", {})]
    out = DeepSeekV3ToolParser().parse("I will check." + deepseek_v32(calls))
    assert only_ok(out) == calls
    assert out.content == "I will check."


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (deepseek_v31([("f", {})]).replace("<｜tool▁sep｜>", ""), "no <｜tool▁sep｜>"),
        (deepseek_v31([("f", {})]).replace("{}", "{x}"), "not valid JSON"),
        (deepseek_v31([("f", {})]).replace("<｜tool▁calls▁end｜>", ""), "not closed"),
        (deepseek_v32([("f", {"a": 1})]).replace(">1<", ">one<"), "not valid JSON"),
        (deepseek_v32([("f", {})]).replace("</｜DSML｜invoke>", ""), "not closed"),
    ],
)
def test_deepseek_malformed(text: str, error: str) -> None:
    out = DeepSeekV3ToolParser().parse(text)
    assert out.calls and any(c.error is not None and error in c.error for c in out.calls), out


def test_deepseek_thinking_hides_calls() -> None:
    out = DeepSeekV3ToolParser().parse("plan " + deepseek_v31([("f", {})]) + "</think>Answer.")
    assert out.calls == [] and out.content == "Answer." and out.reasoning is not None


# -- gpt_oss -------------------------------------------------------------------------------------------------


def test_gpt_oss_analysis_then_call() -> None:
    text = "<|channel|>analysis<|message|>Need the weather.<|end|>" + harmony("weather", ARGS)
    out = GptOssToolParser().parse(text)
    assert out.reasoning == "Need the weather."
    assert only_ok(out) == [("weather", ARGS)]
    assert out.calls[0].raw == harmony("weather", ARGS)


def test_gpt_oss_template_layout_and_call_terminator() -> None:
    text = " to=functions.noop<|channel|>commentary json<|message|>{}<|call|>"
    assert only_ok(GptOssToolParser().parse(text)) == [("noop", {})]


def test_gpt_oss_final_and_preamble_are_content() -> None:
    text = (
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Checking now."
        "<|end|><|start|>assistant<|channel|>final<|message|>It is 3°C in 東京."
    )
    out = GptOssToolParser().parse(text)
    assert out.calls == [] and out.content == "Checking now.\n\nIt is 3°C in 東京." and out.reasoning == "think"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<|channel|>analysis to=functions.f<|message|>{}<|call|>", "commentary channel"),
        ("<|channel|>commentary to=browser.search<|message|>{}<|call|>", "unknown recipient"),
        ("<|channel|>commentary to=functions.f<|message|>{}<|end|>", "ended with <|end|>"),
        ("<|channel|>commentary to=functions.f <|constrain|>yaml<|message|>a: 1", "content type"),
        ("<|channel|>commentary to=functions.f<|message|>{nope", "not valid JSON"),
    ],
)
def test_gpt_oss_malformed(text: str, error: str) -> None:
    out = GptOssToolParser().parse(text)
    assert len(out.calls) == 1 and out.calls[0].error is not None and error in out.calls[0].error, out
    assert out.calls[0].raw == text


def test_gpt_oss_plain_text_is_content() -> None:
    assert GptOssToolParser().parse("just text").content == "just text"


# -- every parser: never raises, never runs a call drafted in reasoning ----------------------------------------

ALL = [
    Llama3JSONToolParser, MistralToolParser, GLMToolParser, KimiK2ToolParser, DeepSeekV3ToolParser, GptOssToolParser,
    Gemma4ToolParser,
]  # fmt: skip
MARKUP = [
    "<think>", "</think>", "[THINK]", "[/THINK]", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
    "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_end|>",
    "<|tool_call_argument_begin|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜DSML｜function_calls>", "<|channel|>", "<|message|>",
    "<|end|>", "<|call|>", "<|start|>", " to=functions.f", "commentary", "analysis", "{", "}", '"', "f", ":0", "\n",
    "<|tool_call>", "<tool_call|>", "call:f", '<|"|>', "<|channel>", "<channel|>", "<|tool_response>", "[", "]", ",",
]  # fmt: skip


@pytest.mark.parametrize("parser_cls", ALL)
@given(st.lists(st.one_of(st.sampled_from(MARKUP), st.text(max_size=5)), max_size=25))
def test_parse_never_raises(parser_cls: type, pieces: list[str]) -> None:
    out = parser_cls().parse("".join(pieces), SCHEMA)
    assert isinstance(out, ParsedOutput)
    for call in out.calls:
        assert call.raw and (call.error is None or call.input == {})


DRAFTS = {
    Llama3JSONToolParser: ("<think>", "</think>", "<|python_tag|>" + llama3("f", {})),
    MistralToolParser: ("[THINK]", "[/THINK]", mistral_v11([("f", {})])),
    GLMToolParser: ("<think>", "</think>", glm("f", {})),
    KimiK2ToolParser: ("<think>", "</think>", kimi([("f", {})])),
    DeepSeekV3ToolParser: ("<think>", "</think>", deepseek_v31([("f", {})])),
    Gemma4ToolParser: ("<|channel>", "<channel|>", "<|tool_call>call:f{}<tool_call|>"),
}


@pytest.mark.parametrize("parser_cls", list(DRAFTS))
@given(before=st.text(max_size=20), after=st.text(max_size=20), preopened=st.booleans())
def test_calls_drafted_in_reasoning_never_returned(parser_cls: type, before: str, after: str, preopened: bool) -> None:
    start, end, call = DRAFTS[parser_cls]
    for markup in (start, end):
        before, after = before.replace(markup, ""), after.replace(markup, "")
    text = ("" if preopened else start) + before + call + after + end + "done"
    out = parser_cls().parse(text)
    assert out.calls == []
