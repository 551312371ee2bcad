"""tito: exact token-in/token-out rollouts for Strands agents.

Public names are imported lazily, so ``import tito_core`` stays cheap and never imports an adapter,
torch or transformers.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: `import tito_core` (the `tito` command's first import) stays cheap

__version__ = "0.1.0"

_EXPORTS = {
    "TitoModel": "tito_core.strands_front.model",
    "Trajectory": "tito_core.trajectory",
    "TrajectoryRecord": "tito_core.trajectory",
    "Segment": "tito_core.trajectory",
    "Turn": "tito_core.trajectory",
    "Usage": "tito_core.trajectory",
    "ToolParser": "tito_core.tool_parsers.base",
    "ToolCall": "tito_core.tool_parsers.base",
    "ParsedOutput": "tito_core.tool_parsers.base",
    "Backend": "tito_core.backend",
    "GenerateRequest": "tito_core.backend",
    "GenerateResult": "tito_core.backend",
    "SamplingParams": "tito_core.backend",
    "get_backend": "tito_core.plugins",
    "get_tool_parser": "tito_core.plugins",
    "list_backends": "tito_core.plugins",
    "list_tool_parsers": "tito_core.plugins",
    "hookimpl": "tito_core.plugins",
    "BackendSpec": "tito_core.plugins",
    "ToolParserSpec": "tito_core.plugins",
    "load_config": "tito_core.config",
    "TitoConfig": "tito_core.config",
    "check_prefix_preservation": "tito_core.analysis.prefix_check",
    "PrefixReport": "tito_core.analysis.prefix_check",
    "TitoError": "tito_core.errors",
    "sampling_params": "tito_core.backend",
    "load_tokenizer": "tito_core.tokenizers",
    "aload_tokenizer": "tito_core.tokenizers",
    "rollout": "tito_core.runner",
    "arollout": "tito_core.runner",
    "RolloutRecord": "tito_core.runner",
    "weight_update": "tito_core.weights",
    "WeightProbe": "tito_core.weights",
}

__all__ = [
    "Backend",
    "BackendSpec",
    "GenerateRequest",
    "GenerateResult",
    "ParsedOutput",
    "PrefixReport",
    "RolloutRecord",
    "SamplingParams",
    "Segment",
    "TitoConfig",
    "TitoError",
    "TitoModel",
    "ToolCall",
    "ToolParser",
    "ToolParserSpec",
    "Trajectory",
    "TrajectoryRecord",
    "Turn",
    "Usage",
    "WeightProbe",
    "aload_tokenizer",
    "arollout",
    "check_prefix_preservation",
    "get_backend",
    "get_tool_parser",
    "hookimpl",
    "list_backends",
    "list_tool_parsers",
    "load_config",
    "load_tokenizer",
    "rollout",
    "sampling_params",
    "weight_update",
]

if TYPE_CHECKING:
    from typing import Any

    from .analysis.prefix_check import PrefixReport, check_prefix_preservation
    from .backend import Backend, GenerateRequest, GenerateResult, SamplingParams, sampling_params
    from .config import TitoConfig, load_config
    from .errors import TitoError
    from .plugins import (
        BackendSpec,
        ToolParserSpec,
        get_backend,
        get_tool_parser,
        hookimpl,
        list_backends,
        list_tool_parsers,
    )
    from .runner import RolloutRecord, arollout, rollout
    from .strands_front.model import TitoModel
    from .tokenizers import aload_tokenizer, load_tokenizer
    from .tool_parsers.base import ParsedOutput, ToolCall, ToolParser
    from .trajectory import Segment, Trajectory, TrajectoryRecord, Turn, Usage
    from .weights import WeightProbe, weight_update


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tito_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
