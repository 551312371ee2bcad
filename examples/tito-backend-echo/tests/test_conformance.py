"""Run tito's backend conformance kit against the echo backend, as every adapter does."""

from __future__ import annotations

from typing import Any

import pytest
from tito_backend_echo import EchoBackend

from tito_testing.conformance import BackendConformanceTests
from tito_testing.tokenizers import load_qwen_tokenizer


class TestEchoConformance(BackendConformanceTests):
    echoes_prompt_ids = True
    supports_prompt_logprobs = True
    cancel_max_new_tokens = 4096
    cancel_after_s = 0.01

    @pytest.fixture
    def tokenizer(self) -> Any:
        return load_qwen_tokenizer("qwen3")

    @pytest.fixture
    def backend(self, tokenizer: Any) -> EchoBackend:
        # A tiny per-token delay makes a long request take long enough to be cancelled in flight.
        return EchoBackend(eos_token_id=tokenizer.eos_token_id, delay_s=0.001)
