"""The backend on an already-loaded model (``model=``): the trainer's module itself, weights updated in place.

What a training loop in this process needs (examples/train_reinforce): generation uses the very module the
optimizer updates, nothing the backend keeps survives a weight change, and the module trains after the
backend's worker thread generated with it (under inference mode).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_transformers import TransformersBackend

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30]  # "Hello there, how are you?" in the Qwen3 vocabulary


@pytest.fixture
def model(tiny_model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def greedy_request(tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(
        rid=uuid.uuid4().hex,
        input_ids=PROMPT,
        prefix_len=0,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=tokens, ignore_eos=True),
    )


def reference_greedy(model: Any, tokens: int = 8) -> tuple[list[int], list[float]]:
    """Greedy ids and raw logprobs by full forward passes of ``model`` (no cache), independent of the backend."""
    import torch

    ids = list(PROMPT)
    logprobs: list[float] = []
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(torch.argmax(logits))
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(PROMPT) :], logprobs


def perturb(model: Any, seed: int) -> None:
    """Change every weight in place, as an optimizer step does (by much more, so greedy ids change)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std().clamp(min=0.02))


async def test_generation_follows_in_place_weight_changes(model: Any) -> None:
    backend = TransformersBackend(model=model, num_threads=1)
    try:
        assert backend.model is model and backend.model_path == model.name_or_path
        before = await backend.generate(greedy_request())
        assert (before.output_ids, pytest.approx(before.output_logprobs, abs=1e-4)) == reference_greedy(model)
        perturb(model, seed=1)
        after = await backend.generate(greedy_request())  # the same backend, its worker thread still running
        expected_ids, expected_logprobs = reference_greedy(model)
        assert after.output_ids == expected_ids != before.output_ids
        assert after.output_logprobs == pytest.approx(expected_logprobs, abs=1e-4)
    finally:
        backend.close()


async def test_the_model_trains_after_generating_and_the_next_request_sees_the_step(model: Any) -> None:
    import torch

    backend = TransformersBackend(model=model, num_threads=1)
    try:
        first = await backend.generate(greedy_request())  # the worker ran it under torch.inference_mode()
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=50.0)
        ids = torch.tensor([[*PROMPT, *first.output_ids]])
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(1, ids[0, len(PROMPT) :, None]).sum()
        (-logp).backward()  # would raise if any tensor the forward uses had been made under inference mode
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        second = await backend.generate(greedy_request())
        expected_ids, _ = reference_greedy(model)
        assert second.output_ids == expected_ids
        assert second.output_logprobs is not None and first.output_logprobs is not None
        assert sum(second.output_logprobs) != pytest.approx(sum(first.output_logprobs), abs=1e-3)
    finally:
        backend.close()


def test_a_shared_model_is_put_in_eval_mode_and_used_as_is(model: Any, tiny_model_dir: Path) -> None:
    model.train()
    backend = TransformersBackend(str(tiny_model_dir), model=model)
    try:
        assert backend.model is model and not model.training
        assert backend.model_path == str(tiny_model_dir) and str(backend.device) == "cpu"
        assert next(model.parameters()).dtype == backend.dtype
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dtype": "bfloat16"}, "apply to a model loaded from `model_path`"),
        ({"attn_implementation": "eager"}, "apply to a model loaded from `model_path`"),
        ({"device": "meta"}, "is on cpu, not on the `device` given"),
    ],
)
def test_options_that_contradict_a_shared_model_are_refused(model: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformersBackend(model=model, **options)


def test_a_model_or_a_path_is_required() -> None:
    with pytest.raises(ValueError, match="give `model_path`"):
        TransformersBackend()
    with pytest.raises(ValueError, match="must be a loaded causal LM"):
        TransformersBackend(model="not a model")
