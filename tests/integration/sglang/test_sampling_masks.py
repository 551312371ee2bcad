"""Kept sets on the real SGLang server (tiny Qwen3, bf16): a rollout with top_p 0.9 and top_k 20 records one kept set
per output token, directly and through each gateway front, and a float32 transformers forward pass renormalised over
them gives the recorded logprobs (within the engine's bf16 noise); the full-vocabulary logprobs are off by log S."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito_core.backend import SamplingParams
from tito_core.config import TitoConfig
from tito_core.conversation import Conversation
from tito_core.gateway import Gateway
from tito_core.kept_logprobs import kept_logprobs, log_kept_mass
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.trajectory import Trajectory
from tito_sglang import SGLangBackend
from tito_testing.tokenizers import qwen_tokenizer_dir

from ..weight_updates import BF16_MAX, BF16_MEAN
from .conftest import REPORT

pytestmark = pytest.mark.integration

TEMPERATURE = 0.8
SAMPLING = {"temperature": TEMPERATURE, "top_p": 0.9, "top_k": 20, "max_new_tokens": 16, "seed": 7}


def _trainer_logits(model_dir: Path, ids: list[int]) -> np.ndarray:
    """A float32 transformers forward pass: the logits predicting ``ids[1:]``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, :-1].float().numpy()


def _check(traj: Trajectory, model_dir: Path, what: str) -> None:
    """Every turn's kept sets fit its output; renormalised trainer logprobs match, full-vocabulary ones are off."""
    logits = _trainer_logits(model_dir, traj.token_ids)
    gaps, off, log_s, same = [], [], [], 0
    for turn in traj.turns:
        mask = turn.sampling_mask
        assert mask is not None and turn.sampling_mask_missing is None, what
        start, end = turn.output_start, turn.output_start + turn.output_len
        out = traj.token_ids[start:end]
        rows = mask.to_lists()
        assert len(rows) == len(out) and all(t in row and len(row) <= 20 for t, row in zip(out, rows, strict=True))
        assert mask.temperature == TEMPERATURE
        recorded = np.array(traj.logprobs[start:end])
        at = logits[start - 1 : end - 1]
        renormalised = kept_logprobs(at, out, mask)
        scaled = at / TEMPERATURE
        top = scaled.max(-1)
        full = scaled[np.arange(len(out)), out] - top - np.log(np.exp(scaled - top[:, None]).sum(-1))
        gaps.extend(np.abs(renormalised - recorded))
        off.extend((full - recorded) - log_kept_mass(at, mask))
        log_s.extend(log_kept_mass(at, mask))
        same += sum(
            sorted(row) == sorted(np.argsort(-row_logits)[:20].tolist())
            for row, row_logits in zip(rows, at, strict=True)
        )
        assert log_kept_mass(at, mask).mean() < -1.0  # 20 of ~152k ids on a random model: a large truncation
    REPORT.append(
        f"kept sets ({what}, top_p 0.9, top_k 20, T {TEMPERATURE}): {len(gaps)} tokens, renormalised float32 "
        f"trainer vs recorded |Δ| mean {np.mean(gaps):.2e} max {np.max(gaps):.2e}; full-vocabulary minus log S vs "
        f"recorded |Δ| max {np.max(np.abs(off)):.2e}; log S mean {np.mean(log_s):.2f}; kept set = the float32 "
        f"trainer's top 20 on {same}/{len(gaps)} tokens"
    )
    assert np.mean(gaps) < BF16_MEAN and np.max(gaps) < BF16_MAX, (np.mean(gaps), np.max(gaps))
    assert np.max(np.abs(off)) < BF16_MAX  # the full-vocabulary logprob is the recorded one plus log S


async def test_a_truncating_rollout_records_kept_sets_the_trainer_renormalises_over(
    sglang_backend: SGLangBackend, sglang_model_dir: Path, qwen3_tokenizer: Any
) -> None:
    rollout = Rollout(sglang_backend, ChatRenderer(qwen3_tokenizer), get_tool_parser("hermes"))
    options = CallOptions(sampling=SamplingParams(**SAMPLING, ignore_eos=True))
    user = {"role": "user", "content": "Count the kept sets."}
    first = await rollout.call(Conversation(messages=[user]), options)
    again = [user, first.reply(), {"role": "user", "content": "Again."}]
    await rollout.call(Conversation(messages=again), options)
    assert len(rollout.trajectory.turns) == 2
    _check(rollout.trajectory, sglang_model_dir, "core, 2 turns")


FRONTS = ["chat", "responses", "messages"]


@pytest.mark.parametrize("front", FRONTS)
async def test_each_gateway_front_records_the_kept_sets(
    sglang_backend: SGLangBackend, sglang_model_dir: Path, qwen3_tokenizer: Any, front: str
) -> None:
    import httpx

    config = TitoConfig(backend="sglang", tokenizer=str(qwen_tokenizer_dir("qwen3")), sampling=SAMPLING)
    gateway = Gateway(config, tokenizer=qwen3_tokenizer, backend=sglang_backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id=front)
        bearer = {"authorization": f"Bearer {rollout.token}"}
        text = [{"role": "user", "content": "Count the kept sets."}]
        requests = {
            "chat": ("/chat/completions", {"model": "tiny", "messages": text}, bearer),
            "responses": ("/responses", {"model": "tiny", "input": "Count the kept sets."}, bearer),
            "messages": (
                "/messages",
                {"model": "tiny", "max_tokens": 16, "messages": text},
                {"x-api-key": rollout.token, "anthropic-version": "2023-06-01"},
            ),
        }
        path, body, headers = requests[front]
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.post(rollout.base_url + path, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    assert len(traj.turns) == 1
    _check(traj, sglang_model_dir, f"gateway {front}")
