"""The core's own plugin: built-in tool parsers and the in-process test backend.

Registered like any third-party plugin (entry point ``core`` in tito-core's ``pyproject.toml``, or
directly by the plugin manager when running from a source tree). Factories are import strings, so
listing them imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from tito_core.plugins import BackendSpec, ToolParserSpec, hookimpl


@hookimpl
def tito_backends() -> Iterator[BackendSpec]:
    """Yield the in-process backend used by tests and examples."""
    yield BackendSpec(
        "scripted",
        "tito_core.testing.scripted:ScriptedBackend",
        "In-process test backend that returns scripted texts as token ids",
    )


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
