"""Strands' ``tool_choice`` on the embedded backend: the core's grammar of the parser's call syntax, applied here.

The same checks as the vLLM and SGLang real-server suites (``tests/integration/forced_calls.py``), on the tiny
random Qwen3: a call it makes is the grammar's doing, and its ids and logprobs are recorded verbatim.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..integration.forced_calls import forced_first_call, forced_structured_output

pytest.importorskip("xgrammar")

ANSWER_RX = r"The sum is [0-9]{1,2}\."


@pytest.mark.parametrize("parser", ["hermes", "qwen_xml"])
async def test_tool_choice_forces_a_call_with_the_parsers_grammar(
    tiny_backend: Any, tokenizer: Any, parser: str
) -> None:
    await forced_first_call(tiny_backend, tokenizer, parser=parser, answer_extra={"regex": ANSWER_RX})


async def test_structured_output_is_forced(tiny_backend: Any, tokenizer: Any) -> None:
    await forced_structured_output(tiny_backend, tokenizer)
