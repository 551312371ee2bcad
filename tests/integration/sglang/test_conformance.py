"""The core's backend conformance kit, run against the real SGLang server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tito_sglang import SGLangBackend
from tito_testing.conformance import BackendConformanceTests, ModelConformanceTests

pytestmark = pytest.mark.integration


@pytest.fixture
def tokenizer() -> Any:
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture
async def backend(sglang_url: str) -> AsyncIterator[SGLangBackend]:
    """The kit's ``backend`` fixture, shared by the backend-level and TitoModel-level classes."""
    backend = SGLangBackend(sglang_url, timeout=180.0)
    yield backend
    await backend.aclose()


class TestSGLangConformance(BackendConformanceTests):
    supports_prompt_logprobs = True
    echoes_prompt_ids = False  # /generate reports prompt_tokens, not the ids (it takes them as given)
    deterministic_greedy = True
    # CPU decoding of the tiny model: ~100 tokens/s, so 2000 tokens are still running when cancelled.
    cancel_max_new_tokens = 2000
    cancel_after_s = 0.5


class TestSGLangModelConformance(ModelConformanceTests):
    """The kit's TitoModel-level tests: a Strands agent on the real server, tool calls forced by ``regex``."""

    def constrain(self, regex: str) -> dict[str, Any] | None:
        return {"regex": regex}
