"""The core's conformance kit, run against the embedded backend on the tiny random Qwen3."""

from __future__ import annotations

from typing import Any

from tito_testing.conformance import BackendConformanceTests, ModelConformanceTests


class TestTransformersConformance(BackendConformanceTests):
    supports_prompt_logprobs = True
    echoes_prompt_ids = True  # the ids are used exactly as given, and returned as prompt_ids
    deterministic_greedy = True
    # The tiny model decodes hundreds of tokens a second on CPU: 4000 are still running after 0.2 s.
    cancel_max_new_tokens = 4000
    cancel_after_s = 0.2


class TestTransformersModelConformance(ModelConformanceTests):
    """A Strands agent through TitoModel on the embedded backend; regex-constrained turns force real tool calls."""

    def constrain(self, regex: str) -> dict[str, Any] | None:
        return {"regex": regex}  # SGLang's name, read by the embedded backend too
