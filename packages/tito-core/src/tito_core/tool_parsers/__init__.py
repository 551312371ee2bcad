"""Tool parsers: model output text in, reasoning / content / tool calls out (strict, think-aware)."""

from tito_core.tool_parsers._reasoning import ReasoningSplit, split_reasoning
from tito_core.tool_parsers.base import UNKNOWN_TOOL_NAME, ParsedOutput, ToolCall, ToolParser, new_call_id
from tito_core.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser
from tito_core.tool_parsers.gemma4 import Gemma4ToolParser
from tito_core.tool_parsers.glm import GLMToolParser
from tito_core.tool_parsers.gpt_oss import GptOssToolParser
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_core.tool_parsers.infer import infer_tool_parser
from tito_core.tool_parsers.kimi_k2 import KimiK2ToolParser
from tito_core.tool_parsers.llama3_json import Llama3JSONToolParser
from tito_core.tool_parsers.mistral import MistralToolParser
from tito_core.tool_parsers.qwen_xml import QwenXMLToolParser

__all__ = [
    "UNKNOWN_TOOL_NAME",
    "DeepSeekV3ToolParser",
    "GLMToolParser",
    "Gemma4ToolParser",
    "GptOssToolParser",
    "HermesToolParser",
    "KimiK2ToolParser",
    "Llama3JSONToolParser",
    "MistralToolParser",
    "ParsedOutput",
    "QwenXMLToolParser",
    "ReasoningSplit",
    "ToolCall",
    "ToolParser",
    "infer_tool_parser",
    "new_call_id",
    "split_reasoning",
]
