"""Sampling masks on the embedded backend (tiny Qwen3, float32): the kept sets its sampler returns equal a reference
computed from the model's logits, and the closed form holds: the trainer's logprobs over the kept sets
(:func:`tito_core.kept_logprobs.kept_logprobs`) are the recorded ones, full-vocabulary ones are off by log S."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.kept_logprobs import kept_logprobs, log_kept_mass

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def backend32(tiny_model_dir: Path) -> Iterator[Any]:
    from tito_transformers import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> Any:
    from tito_transformers.scoring import load_model

    return load_model(str(tiny_model_dir))


def _logits(model: Any, ids: list[int], first: int) -> np.ndarray:
    """The trainer's float32 logits predicting ``ids[first:]`` (one forward pass, teacher-forced)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids])).logits[0].float()
    return out[first - 1 : len(ids) - 1].numpy()


def _reference_kept(logits: np.ndarray, top_k: int, top_p: float) -> list[list[int]]:
    """Top-k then top-p over softmax(logits / T), as the engines define them (the smallest prefix reaching p)."""
    rows = []
    for row in logits / TEMPERATURE:
        order = np.argsort(-row, kind="stable")[:top_k]
        probs = np.exp(row[order] - row[order].max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        rows.append(sorted(order[before <= top_p].tolist()))
    return rows


async def _sample(backend: Any, prompt: list[int], **sampling: Any) -> Any:
    request = GenerateRequest(
        rid=uuid.uuid4().hex,
        input_ids=prompt,
        prefix_len=0,
        sampling=SamplingParams(temperature=TEMPERATURE, seed=11, max_new_tokens=24, ignore_eos=True, **sampling),
        return_sampling_mask=True,
    )
    return await backend.generate(request)


@pytest.mark.parametrize(("top_k", "top_p"), [(20, 0.9), (50, 1.0), (200, 0.5)])
async def test_kept_sets_equal_a_reference_from_the_logits(
    backend32: Any, trainer: Any, tokenizer: Any, top_k: int, top_p: float
) -> None:
    prompt = tokenizer.encode("Kept sets of a truncated sampler:")
    result = await _sample(backend32, prompt, top_k=top_k, top_p=top_p)
    assert result.sampling_mask is not None and result.sampling_mask.rows == 24
    logits = _logits(trainer, [*prompt, *result.output_ids], len(prompt))
    reference = _reference_kept(logits, top_k if top_k > 0 else logits.shape[1], top_p)
    assert result.sampling_mask.to_lists() == reference
    assert all(t in row for t, row in zip(result.output_ids, reference, strict=True))


async def test_the_closed_form_holds_with_and_without_the_mask(backend32: Any, trainer: Any, tokenizer: Any) -> None:
    prompt = tokenizer.encode("The trainer scores what the sampler kept:")
    result = await _sample(backend32, prompt, top_k=20, top_p=0.9)
    mask, ids = result.sampling_mask, result.output_ids
    recorded = np.array(result.output_logprobs)
    logits = _logits(trainer, [*prompt, *ids], len(prompt))
    renormalised = kept_logprobs(logits, ids, mask, temperature=TEMPERATURE)
    assert np.abs(renormalised - recorded).max() < 1e-4  # the behaviour distribution, exactly
    scaled = logits / TEMPERATURE
    full = scaled[np.arange(len(ids)), ids] - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1))
    full -= scaled.max(-1)
    log_s = log_kept_mass(logits, mask, temperature=TEMPERATURE)
    assert np.abs((full - recorded) - log_s).max() < 1e-4  # the common mistake is off by log S, per token
    assert log_s.max() <= 1e-6 and log_s.mean() < -0.05  # a real truncation: the kept sets hold < 95 % of the mass

    import torch  # the same helper on torch tensors, with a gradient

    tensor = torch.tensor(logits, requires_grad=True)
    scored = kept_logprobs(tensor, ids, mask, temperature=TEMPERATURE)
    scored.sum().backward()
    assert np.abs(scored.detach().numpy() - recorded).max() < 1e-4
    assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


def test_a_generation_config_that_truncates_by_default_records_its_kept_sets(
    tiny_model_dir: Path, tmp_path: Path, qwen3_tokenizer: Any
) -> None:
    """Unset top_k / top_p take the model's generation_config defaults; the core sees them and records the sets."""
    import asyncio
    import json
    import shutil

    from tito_core.conversation import Conversation
    from tito_core.plugins import get_tool_parser
    from tito_core.render.renderer import ChatRenderer
    from tito_core.rollout_core import CallOptions, Rollout
    from tito_transformers import TransformersBackend

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(
        json.dumps({**config, "do_sample": True, "temperature": TEMPERATURE, "top_k": 20, "top_p": 0.9})
    )
    backend = TransformersBackend(folder, dtype="float32", num_threads=1)
    try:
        rollout = Rollout(backend, ChatRenderer(qwen3_tokenizer), get_tool_parser("hermes"))
        options = CallOptions(sampling=SamplingParams(max_new_tokens=12, seed=5, ignore_eos=True))
        asyncio.run(rollout.call(Conversation(messages=[{"role": "user", "content": "hi"}]), options))
    finally:
        backend.close()
    (turn,) = rollout.trajectory.turns
    assert turn.sampling_mask is not None and turn.sampling_mask.rows == 12
    assert all(1 <= len(row) <= 20 for row in turn.sampling_mask.to_lists())
