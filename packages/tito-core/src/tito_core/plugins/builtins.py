"""The core's own plugin: the built-in tool parsers, input kinds and vision families.

The scripted test backend comes from tito-testing.

Registered like any third-party plugin (entry point ``core`` in tito-core's ``pyproject.toml``, or
directly by the plugin manager when running from a source tree). Factories are import strings, so
listing them imports nothing. It needs only the plugin contract (``tito_core.plugins.hookspecs``),
never the manager that loads it.
"""

# ruff: noqa: RUF001  (DeepSeek's markers are spelled with full-width characters)

from __future__ import annotations

from collections.abc import Iterator

from tito_core.plugins.hookspecs import FrontSpec, InputKindSpec, ToolParserSpec, VisionFamilySpec, hookimpl


@hookimpl
def tito_tool_parsers() -> Iterator[ToolParserSpec]:
    """Yield the tool-call formats the core understands."""
    yield ToolParserSpec(
        "hermes",
        "tito_core.tool_parsers.hermes:HermesToolParser",
        "<tool_call>{json}</tool_call> (Hermes, Qwen2.5, Qwen3)",
    )
    yield ToolParserSpec(
        "qwen_xml",
        "tito_core.tool_parsers.qwen_xml:QwenXMLToolParser",
        "<tool_call><function=name><parameter=p>...</parameter></function></tool_call> (Qwen3-Coder)",
    )
    yield ToolParserSpec(
        "llama3_json",
        "tito_core.tool_parsers.llama3_json:Llama3JSONToolParser",
        '{"name": ..., "parameters": {...}} bare or after <|python_tag|> (Llama 3.1 / 3.2 / 3.3)',
    )
    yield ToolParserSpec(
        "mistral",
        "tito_core.tool_parsers.mistral:MistralToolParser",
        "[TOOL_CALLS][{json}, ...] (tokenizer v3-v7) or [TOOL_CALLS]name[CALL_ID]id[ARGS]{json} (v11+) (Mistral)",
    )
    yield ToolParserSpec(
        "glm",
        "tito_core.tool_parsers.glm:GLMToolParser",
        "<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call> (GLM-4.5 / 4.6 / 4.7)",
    )
    yield ToolParserSpec(
        "kimi_k2",
        "tito_core.tool_parsers.kimi_k2:KimiK2ToolParser",
        "<|tool_call_begin|>functions.name:i<|tool_call_argument_begin|>{json}... (Kimi K2)",
    )
    yield ToolParserSpec(
        "deepseek_v3",
        "tito_core.tool_parsers.deepseek_v3:DeepSeekV3ToolParser",
        "<｜tool▁calls▁begin｜>...<｜tool▁sep｜>{json}... (DeepSeek V3 / V3.1) or DSML invokes (V3.2)",
    )
    yield ToolParserSpec(
        "gemma4",
        "tito_core.tool_parsers.gemma4:Gemma4ToolParser",
        '<|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|> (Gemma 4)',
    )
    yield ToolParserSpec(
        "gpt_oss",
        "tito_core.tool_parsers.gpt_oss:GptOssToolParser",
        "harmony channels: analysis = reasoning, commentary to=functions.name = calls, final = content (gpt-oss)",
    )


@hookimpl
def tito_input_kinds() -> Iterator[InputKindSpec]:
    """Yield the input kinds the core understands."""
    yield InputKindSpec("image", "tito_core.media.image:Image", "One picture (PNG, JPEG, GIF, WebP)")
    yield InputKindSpec("video", "tito_core.media.video:Video", "A short clip as a list of frames")


@hookimpl
def tito_vision_families() -> Iterator[VisionFamilySpec]:
    """Yield the vision model families the core knows."""
    yield VisionFamilySpec(
        "qwen_vl",
        "tito_core.media.families:QwenVLFamily",
        ("Qwen2VL", "Qwen2_5_VL", "Qwen3VL"),
        "Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5: grid_thw.prod() // merge_size**2 pads per image or video",
    )


@hookimpl
def tito_fronts() -> Iterator[FrontSpec]:
    """Yield the gateway's own fronts (``tito serve``)."""
    yield FrontSpec(
        "chat_completions", "tito_core.gateway.fronts.chat_completions:ChatCompletions", "OpenAI chat completions"
    )
    yield FrontSpec("responses", "tito_core.gateway.fronts.responses:Responses", "OpenAI Responses API")
    yield FrontSpec("messages", "tito_core.gateway.fronts.messages:Messages", "Anthropic Messages API")
    yield FrontSpec("gemini", "tito_core.gateway.fronts.gemini:Gemini", "Google's Gemini API (generateContent)")
