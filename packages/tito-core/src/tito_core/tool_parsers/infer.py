"""Choose a tool parser from a tokenizer: its chat template's markup, then its special tokens."""

# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are spelled with full-width characters)

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from tito_core.errors import ConfigError

# (parser, markers that must all appear), most specific first: GLM and Qwen3-Coder templates also
# write <tool_call>, so they are checked before hermes.
INFERENCE_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gpt_oss", ("<|channel|>",)),
    ("kimi_k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek_v3", ("<｜tool▁calls▁begin｜>",)),
    ("deepseek_v3", ("｜DSML｜",)),
    ("glm", ("<arg_key>",)),
    ("gemma4", ("<|tool_call>",)),
    ("qwen_xml", ("<tool_call>", "<function=")),
    ("hermes", ("<tool_call>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
    # Llama 3.2's template has no <|python_tag|>; its tool turns are ipython headers and "parameters" calls.
    ("llama3_json", ("<|start_header_id|>ipython", '"parameters"')),
)


def _template_texts(tokenizer: Any) -> list[str]:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return [template]
    if isinstance(template, dict):
        return [t for t in template.values() if isinstance(t, str)]
    return []


def _special_tokens(tokenizer: Any) -> str:
    tokens: list[str] = []
    # Unusual tokenizer objects (e.g. a MistralCommonBackend) may lack or fail on any of these.
    with contextlib.suppress(Exception):
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        tokens.extend(str(getattr(token, "content", token)) for token in decoder.values())
    with contextlib.suppress(Exception):
        tokens.extend(str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ())
    try:  # mistral-common tokenizers (and transformers' MistralCommonBackend) keep control tokens here
        inner = getattr(getattr(tokenizer, "tokenizer", None), "instruct_tokenizer", None)
        inner = getattr(inner, "tokenizer", inner)
        special = getattr(inner, "_all_special_tokens", None) or getattr(inner, "special_tokens", None)
        if isinstance(special, Iterable):
            tokens.extend(str(getattr(t, "get", lambda _k, t=t: t)("token_str")) for t in special)
    except Exception:
        pass
    return "\n".join(tokens)


def _match(text: str) -> str | None:
    for parser, markers in INFERENCE_RULES:
        if all(marker in text for marker in markers):
            return parser
    return None


def infer_tool_parser(tokenizer: Any, chat_template: str | None = None) -> str:
    """Name the tool parser for ``tokenizer``'s model family.

    The chat template (``chat_template`` when given, else the tokenizer's) is searched first (the markup it
    renders calls with), then the tokenizer's special tokens: ``<|channel|>`` -> ``gpt_oss``,
    ``<|tool_calls_section_begin|>`` -> ``kimi_k2``,
    ``<｜tool▁calls▁begin｜>`` or DSML -> ``deepseek_v3``, ``<arg_key>`` -> ``glm``, ``<|tool_call>`` -> ``gemma4``,
    ``<tool_call>`` with
    ``<function=`` -> ``qwen_xml``, ``<tool_call>`` -> ``hermes``, ``[TOOL_CALLS]`` -> ``mistral``,
    ``<|python_tag|>`` (or an ``ipython`` header with ``"parameters"`` calls) -> ``llama3_json``.

    Raises:
        ConfigError: When neither the template nor the special tokens show a known format.

    """
    for text in [chat_template] if chat_template else _template_texts(tokenizer):
        found = _match(text)
        if found:
            return found
    found = _match(_special_tokens(tokenizer))
    if found:
        return found
    looked_for = ", ".join(" + ".join(markers) + f" ({parser})" for parser, markers in INFERENCE_RULES)
    where = (
        "its chat template and special tokens"
        if _template_texts(tokenizer)
        else "its special tokens (no chat template)"
    )
    raise ConfigError(
        f"cannot infer the tool parser of {type(tokenizer).__name__}: none of {looked_for} appears in {where}; "
        "pass tool_parser=NAME"
    )
