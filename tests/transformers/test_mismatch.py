"""The trainer's recompute of recorded logprobs (tito_transformers.scoring) and the mismatch script, on the tiny Qwen3.

Free outputs: the recompute matches what the backend recorded. Outputs under a grammar: the recorded
(post-constraint) logprobs are never below the recompute and differ by many nats, which is why ``tito audit``
reports forced turns apart (tests/transformers/test_audit.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core.analysis.drift import logprob_gap
from tito_core.backend import GenerateRequest, SamplingParams

pytest.importorskip("xgrammar")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backends(tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    from tito_transformers import TransformersBackend

    raw = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1)
    processed = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1, logprobs_mode="processed")
    yield {"raw": raw, "processed": processed}
    raw.close()
    processed.close()


@pytest.fixture(scope="module")
def scorer(tiny_model_dir: Path) -> Any:
    from tito_transformers.scoring import load_model

    return load_model(str(tiny_model_dir))


async def _generate(backend: Any, prompt: list[int], **sampling: Any) -> Any:
    request = GenerateRequest(rid=uuid.uuid4().hex, input_ids=prompt, prefix_len=0, sampling=SamplingParams(**sampling))
    return await backend.generate(request)


async def test_recompute_matches_recorded_raw_logprobs(backends: dict[str, Any], scorer: Any, tokenizer: Any) -> None:
    from tito_transformers.scoring import token_logprobs

    prompt = tokenizer.encode("The trainer scores these tokens again:")
    result = await _generate(backends["raw"], prompt, temperature=0.8, seed=3, max_new_tokens=24, ignore_eos=True)
    assert len(result.output_ids) == 24
    new = token_logprobs(scorer, [*prompt, *result.output_ids])
    assert len(new) == len(prompt) + 24 and new[0] is None
    gap = logprob_gap(zip(result.output_logprobs, new[len(prompt) :], strict=True))
    assert gap.tokens == 24
    assert gap.max_abs < 1e-3
    assert gap.k3 < 1e-6


async def test_recompute_at_the_sampling_temperature_matches_processed_logprobs(
    backends: dict[str, Any], scorer: Any, tokenizer: Any
) -> None:
    from tito_transformers.scoring import token_logprobs_at

    prompt = tokenizer.encode("Processed logprobs follow the temperature:")
    result = await _generate(backends["processed"], prompt, temperature=0.5, seed=5, max_new_tokens=16, ignore_eos=True)
    raw, tempered = token_logprobs_at(scorer, [*prompt, *result.output_ids], (1.0, 0.5))
    recorded = result.output_logprobs
    assert logprob_gap(zip(recorded, tempered[len(prompt) :], strict=True)).max_abs < 1e-3
    # and the raw distribution is a different one: a trainer comparing it with processed logprobs is off
    assert logprob_gap(zip(recorded, raw[len(prompt) :], strict=True)).max_abs > 1e-2


async def test_constrained_logprobs_are_post_constraint(backends: dict[str, Any], scorer: Any, tokenizer: Any) -> None:
    from tito_transformers.scoring import token_logprobs

    prompt = tokenizer.encode("Answer with a tool call:")
    regex = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}\n</tool_call>'
    result = await _generate(
        backends["raw"], prompt, temperature=1.0, seed=1, max_new_tokens=64, extra={"regex": regex}
    )
    assert result.finish_reason == "stop"
    new = token_logprobs(scorer, [*prompt, *result.output_ids])[len(prompt) :]
    old = result.output_logprobs
    assert all(o >= n - 1e-4 for o, n in zip(old, new, strict=True))  # masking only raises a logprob
    gap = logprob_gap(zip(old, new, strict=True))
    assert gap.max_abs > 5.0  # tokens the grammar forced, which the random model finds unlikely
    assert gap.mean_diff < -1.0
