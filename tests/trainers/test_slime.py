"""slime (not on the package index): the generate hook fills a stand-in of slime's ``Sample`` whose fields
and checks follow slime's source as quoted in research/rl_integrations.md §1.2 (slime 624b824a)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from tito_core import Trajectory
from tito_core.export import to_slime
from tito_core.trajectory import Turn, Usage
from tito_testing.scripted import ScriptedBackend

from ..slime_stand_in import Sample
from .helpers import call

pytest.importorskip("tito_sglang.slime", reason="tito-sglang is not installed")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slime" / "generate_with_tito.py"


def check_like_slime(sample: Sample, *, layers: int | None = None, top_k: int | None = None) -> None:
    """The invariants slime asserts on a generated sample before training."""
    assert isinstance(sample.status, Sample.Status)
    # slime/ray/rollout.py: loss_mask covers the response; _validate_response_metadata_lengths: so do logprobs
    assert len(sample.loss_mask) == sample.response_length == len(sample.rollout_log_probs)
    assert 0 < sample.response_length < len(sample.tokens)
    assert set(sample.loss_mask) <= {0, 1}
    # tool and environment tokens carry logprob 0.0
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if not m)
    assert sample.rollout_id
    if layers is not None:
        # rollout_data_utils.validate_rollout_routed_experts_for_replay: (len(tokens) - 1, layers, top_k) int32
        assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, layers, top_k)
        assert str(sample.rollout_routed_experts.dtype) == "int32"


def load_example(monkeypatch, backend, tokenizer):
    spec = importlib.util.spec_from_file_location("generate_with_tito", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "backend_from_slime_args", lambda args: backend)
    monkeypatch.setattr(module, "tokenizer_for", lambda path: tokenizer)
    return module


def stand_in_args() -> SimpleNamespace:
    """The slime arguments the hook reads."""
    return SimpleNamespace(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=30000,
        sglang_server_concurrency=8,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        hf_checkpoint="/models/policy",
        partial_rollout=False,
    )


def test_generate_hook_fills_a_slime_sample(monkeypatch, qwen3_tokenizer):
    backend = ScriptedBackend(qwen3_tokenizer, [call("6 * 7"), "The answer is 42."], weight_version="7")
    module = load_example(monkeypatch, backend, qwen3_tokenizer)
    sample = Sample(prompt="What is 6 times 7?")
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 256, "stop_token_ids": [151645],
              "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False}  # fmt: skip
    out = asyncio.run(module.generate(stand_in_args(), sample, params))
    assert out is sample and sample.status is Sample.Status.COMPLETED
    check_like_slime(sample)
    first = list(backend.requests[0].input_ids)
    assert sample.tokens[: len(first)] == first and sample.response_length == len(sample.tokens) - len(first)
    assert sample.response == qwen3_tokenizer.decode(sample.tokens[len(first) :], skip_special_tokens=False)
    assert 0 < sum(sample.loss_mask) < sample.response_length  # the tool result is in the response, masked
    assert sample.weight_versions == ["7", "7"]  # slime's own field: one per model call


def test_routed_experts_have_slimes_shape():
    traj = Trajectory("r1")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-0.5, -0.25], turn=0)
    rows = struct.pack("<24i", *range(24))  # 4 rows (tokens - 1) x 3 layers x 2 experts
    traj.add_turn(Turn(index=0, rid="x", prompt_start=0, prompt_len=3, output_len=2, finish_reason="length",
                       stop_reason="max_tokens", usage=Usage(prompt_tokens=3, completion_tokens=2),
                       routed_experts=rows, routed_experts_shape=(3, 2)))  # fmt: skip
    traj.set_status("truncated")
    sample = Sample()
    fields = to_slime(traj)
    status = fields.pop("status")
    for name, value in fields.items():
        setattr(sample, name, value)
    sample.status = Sample.Status[status]
    check_like_slime(sample, layers=3, top_k=2)
    assert sample.status is Sample.Status.TRUNCATED
    assert sample.rollout_routed_experts[3, 2].tolist() == [22, 23]


def test_fields_against_the_installed_slime():
    types = pytest.importorskip(
        "slime.utils.types",
        reason="slime is not on the package index: its Sample is checked against the source quoted in "
        "research/rl_integrations.md §1.2 instead (the stand-in in tests/slime_stand_in.py)",
    )
    names = {f.name for f in dataclasses.fields(types.Sample)}
    traj = Trajectory("r1")
    traj.append("prompt", [1], turn=0)
    traj.append("output", [2], [-1.0], turn=0)
    assert set(to_slime(traj)) <= names
