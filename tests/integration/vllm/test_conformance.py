"""The core's backend conformance kit, run against the real vLLM server, both token endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tito_testing.conformance import BackendConformanceTests, ModelConformanceTests
from tito_vllm import VLLMBackend

pytestmark = pytest.mark.integration


class _VLLMKit(BackendConformanceTests):
    supports_prompt_logprobs = True
    deterministic_greedy = True
    # CPU decoding of the tiny model: 2000 tokens are still running after 0.5 s.
    cancel_max_new_tokens = 2000
    cancel_after_s = 0.5
    endpoint: str = "auto"

    @pytest.fixture
    def tokenizer(self, qwen3: Any) -> Any:
        return qwen3

    return_prompt_ids: bool = False

    @pytest.fixture
    async def backend(self, vllm_url: str) -> AsyncIterator[VLLMBackend]:
        backend = VLLMBackend(
            vllm_url,
            endpoint=self.endpoint,  # type: ignore[arg-type]
            return_prompt_ids=self.return_prompt_ids,
            timeout=180.0,
        )
        yield backend
        await backend.aclose()


class TestNativeGenerate(_VLLMKit):
    """``/inference/v1/generate``: ids in, id-tagged logprobs out, no prompt echo by default."""

    endpoint = "generate"
    echoes_prompt_ids = False


class TestNativeGenerateWithEcho(_VLLMKit):
    """``/inference/v1/generate`` with ``return_token_ids``: the prompt ids come back and are checked."""

    endpoint = "generate"
    return_prompt_ids = True
    echoes_prompt_ids = True


class TestCompletions(_VLLMKit):
    """``/v1/completions`` with a token-id prompt: always echoes the prompt ids."""

    endpoint = "completions"
    echoes_prompt_ids = True


class TestVLLMModelConformance(ModelConformanceTests):
    """The kit's TitoModel-level tests: a Strands agent on the real server, tool calls forced by regex."""

    def constrain(self, regex: str) -> dict[str, Any] | None:
        return {"structured_outputs": {"regex": regex}}

    @pytest.fixture
    def tokenizer(self, qwen3: Any) -> Any:
        return qwen3

    @pytest.fixture
    async def backend(self, vllm_url: str) -> AsyncIterator[VLLMBackend]:
        backend = VLLMBackend(vllm_url, timeout=180.0)
        yield backend
        await backend.aclose()
