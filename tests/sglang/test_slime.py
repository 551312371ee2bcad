"""The slime example: its generate() fills a slime Sample with the exact trajectory."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from tito_core.trainers.slime import sampling_from_slime
from tito_sglang.slime import backend_from_slime_args
from tito_testing.scripted import ScriptedBackend

from ..slime_stand_in import Sample, check_like_slime, load_slime_example


def slime_args(**overrides: Any) -> SimpleNamespace:
    values = dict(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        sglang_server_concurrency=64,
        rollout_num_gpus=8,
        rollout_num_gpus_per_engine=2,
        hf_checkpoint="/models/policy",
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def call(expression: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        + ("\n</tool_call>")
    )


def test_example_fills_the_sample_exactly(monkeypatch, qwen3_tokenizer):
    tok = qwen3_tokenizer
    backend = ScriptedBackend(tok, [call("6 * 7"), "The answer is 42."], weight_version="7")
    module = load_slime_example(monkeypatch, backend, tok)
    sample = Sample(prompt="What is 6 times 7?")
    params = {"temperature": 1.0, "max_new_tokens": 128, "skip_special_tokens": False, "no_stop_trim": True}
    out = asyncio.run(module.generate(slime_args(), sample, params))
    assert out is sample and sample.status is Sample.Status.COMPLETED
    first_prompt = len(backend.requests[0].input_ids)
    assert sample.tokens[:first_prompt] == list(backend.requests[0].input_ids)
    assert sample.response_length == len(sample.tokens) - first_prompt
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    assert "42" in tok.decode(backend.requests[1].input_ids[backend.requests[1].prefix_len :])  # tool ran
    assert sample.response.endswith("The answer is 42.<|im_end|>")
    ones = [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
    assert all(lp < 0 for lp in ones) and sum(sample.loss_mask) == len(ones)
    assert backend.requests[0].sampling.max_new_tokens == 128
    check_like_slime(sample)
    assert sample.response == tok.decode(sample.tokens[first_prompt:], skip_special_tokens=False)
    assert 0 < sum(sample.loss_mask) < sample.response_length  # the tool result is in the response, masked
    assert sample.weight_versions == ["7", "7"]  # slime's own field: one per model call


def test_a_failed_rollout_keeps_its_tokens_and_status(monkeypatch, qwen3_tokenizer):
    backend = ScriptedBackend(qwen3_tokenizer, [call("1 + 1")])  # no reply left for the second call
    module = load_slime_example(monkeypatch, backend, qwen3_tokenizer)
    sample = Sample(prompt="1 + 1?")
    asyncio.run(module.generate(slime_args(), sample, {"max_new_tokens": 64}))
    assert sample.status is Sample.Status.FAILED
    assert sample.response_length > 0 and sum(sample.loss_mask) > 0


def test_sampling_params_are_mapped():
    params = sampling_from_slime(
        {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "max_new_tokens": 256,
            "stop": "</answer>",
            "stop_token_ids": [151645],
            "sampling_seed": 7,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "custom_params": {"return_top_p_token_ids": True},
        }
    )
    assert (params.temperature, params.top_p, params.top_k, params.max_new_tokens) == (0.7, 0.9, -1, 256)
    assert params.stop == ("</answer>",) and params.stop_token_ids == (151645,) and params.seed == 7
    assert params.extra == {"custom_params": {"return_top_p_token_ids": True}}


def test_one_backend_per_router_sized_like_slime():
    first = backend_from_slime_args(slime_args())
    assert backend_from_slime_args(slime_args()) is first
    assert backend_from_slime_args(slime_args(sglang_router_port=30001)) is not first
