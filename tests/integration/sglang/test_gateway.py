"""The OpenAI SDK through `tito serve`'s gateway on the real SGLang server: the record holds the engine's own ids."""

from __future__ import annotations

from typing import Any

import pytest

from tito_sglang import SGLangBackend

from ..gateway_sdk import sdk_through_gateway, structured_answer_through_gateway

pytestmark = pytest.mark.integration


async def test_openai_sdk_through_the_gateway_records_the_engines_ids(
    sglang_backend: SGLangBackend, qwen3_tokenizer: Any
) -> None:
    await sdk_through_gateway(sglang_backend, qwen3_tokenizer, name="sglang")


async def test_a_structured_answer_is_decoded_under_its_schema_and_parsed_by_the_sdk(
    sglang_backend: SGLangBackend, qwen3_tokenizer: Any
) -> None:
    await structured_answer_through_gateway(sglang_backend, qwen3_tokenizer, name="sglang")
