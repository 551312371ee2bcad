"""The OpenAI SDK through `tito serve`'s gateway on the real vLLM server: the record holds the engine's own ids."""

from __future__ import annotations

from typing import Any

import pytest

from tito_vllm import VLLMBackend

from ..gateway_sdk import sdk_through_gateway, structured_answer_through_gateway

pytestmark = pytest.mark.integration


async def test_openai_sdk_through_the_gateway_records_the_engines_ids(vllm_url: str, qwen3_tokenizer: Any) -> None:
    backend = VLLMBackend(vllm_url, return_prompt_ids=True)  # the engine echoes what it consumed: checked too
    try:
        await sdk_through_gateway(backend, qwen3_tokenizer, name="vllm")
    finally:
        await backend.aclose()  # the gateway leaves a backend it was given open


async def test_a_structured_answer_is_decoded_under_its_schema_and_parsed_by_the_sdk(
    vllm_url: str, qwen3_tokenizer: Any
) -> None:
    backend = VLLMBackend(vllm_url)
    try:
        await structured_answer_through_gateway(backend, qwen3_tokenizer, name="vllm")
    finally:
        await backend.aclose()
