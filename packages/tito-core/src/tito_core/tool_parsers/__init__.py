"""Tool parsers: model output text in, reasoning / content / tool calls out (strict, think-aware)."""

from tito_core.tool_parsers._reasoning import ReasoningSplit, split_reasoning
from tito_core.tool_parsers.base import UNKNOWN_TOOL_NAME, ParsedOutput, ToolCall, ToolParser, new_call_id
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_core.tool_parsers.qwen_xml import QwenXMLToolParser

__all__ = [
    "UNKNOWN_TOOL_NAME",
    "HermesToolParser",
    "ParsedOutput",
    "QwenXMLToolParser",
    "ReasoningSplit",
    "ToolCall",
    "ToolParser",
    "new_call_id",
    "split_reasoning",
]
