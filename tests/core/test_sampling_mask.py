"""Sampling masks (kept sets) and routing through the core: recorded per output token when sampling truncates,
nothing when it does not, refused or flagged on a backend that cannot return them, checked when returned, and
a call that asked for routing and got none recorded with a reason."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.conversation import Conversation
from tito_core.errors import BackendResponseError, SamplingMaskError
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.sampling_mask import SamplingMask, joined_masks
from tito_core.trajectory import TrajectoryRecord
from tito_testing.scripted import ScriptedBackend, scripted_kept_set, scripted_routing

USER = Conversation(messages=[{"role": "user", "content": "hi"}])
TOP_P = SamplingParams(top_p=0.9, top_k=20, max_new_tokens=8)


def _run(backend, options: CallOptions, tok, calls: int = 1):
    rollout = Rollout(backend, ChatRenderer(tok), get_tool_parser("hermes"))

    async def go() -> list:
        return [await rollout.call(USER, options) for _ in range(calls)]

    return rollout, asyncio.run(go())


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        (SamplingParams(), False),
        (SamplingParams(top_p=1.0, top_k=-1), False),
        (SamplingParams(top_p=0.9), True),
        (SamplingParams(top_k=50), True),
        (SamplingParams(top_k=100), False),  # not below the vocabulary of 100
        (SamplingParams(extra={"min_p": 0.05}), True),
        (SamplingParams(extra={"min_p": 0.0}), False),
        (SamplingParams(top_p=0.9, temperature=0), False),  # greedy samples nothing
    ],
)
def test_truncates_names_exactly_the_truncating_requests(sampling: SamplingParams, expected: bool) -> None:
    assert sampling.truncates(vocab_size=100) is expected


def test_a_mask_round_trips_rows_csr_and_json() -> None:
    rows = [[5, 3], [7], [1, 2, 9]]
    mask = SamplingMask.from_rows(rows)
    assert mask.rows == 3 and mask.to_lists() == rows
    ids, offsets = mask.csr()
    assert ids.tolist() == [5, 3, 7, 1, 2, 9] and offsets.tolist() == [0, 2, 3, 6]
    assert SamplingMask.from_csr(ids, offsets) == mask
    assert msgspec.json.decode(msgspec.json.encode(mask), type=SamplingMask) == mask
    joined = joined_masks(mask, SamplingMask.from_rows([[4]]))
    assert joined is not None and joined.to_lists() == [*rows, [4]]
    assert joined_masks(mask, None) is None


@pytest.mark.parametrize(
    ("rows", "output", "problem"),
    [
        ([[5, 3]], [5, 3], "1 rows for 2 output tokens"),
        ([[5, 3], [4]], [5, 3], "output token 1 (id 3) is not in its own kept set"),
        ([[5, 300]], [5], "outside the vocabulary"),
    ],
)
def test_a_mask_that_does_not_fit_the_output_says_why(rows, output, problem) -> None:
    found = SamplingMask.from_rows(rows).problem(output, vocab_size=100)
    assert found is not None and problem in found


def test_a_truncating_call_records_one_kept_set_per_output_token(qwen3_tokenizer) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["hello there"])
    rollout, (done,) = _run(backend, CallOptions(sampling=TOP_P), qwen3_tokenizer)
    assert backend.requests[0].return_sampling_mask
    turn = rollout.trajectory.turns[0]
    assert turn.sampling_mask is not None and turn.sampling_mask_missing is None
    out = rollout.trajectory.token_ids[turn.output_start : turn.output_start + turn.output_len]
    assert turn.sampling_mask.to_lists() == [scripted_kept_set(t, len(qwen3_tokenizer)) for t in out]
    assert done.sampling_mask == turn.sampling_mask
    record = msgspec.json.decode(rollout.trajectory.to_json(), type=TrajectoryRecord)
    assert record.turns[0].sampling_mask == turn.sampling_mask


def test_a_call_without_truncation_asks_and_stores_nothing(qwen3_tokenizer) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["hello there"])
    rollout, _ = _run(backend, CallOptions(sampling=SamplingParams(temperature=1.0)), qwen3_tokenizer)
    assert not backend.requests[0].return_sampling_mask
    turn = rollout.trajectory.turns[0]
    assert turn.sampling_mask is None and turn.sampling_mask_missing is None
    assert b"sampling_mask" not in rollout.trajectory.to_json()


def test_exact_mode_refuses_a_truncating_call_on_a_backend_without_masks(qwen3_tokenizer) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["hello"], sampling_masks=False)
    with pytest.raises(SamplingMaskError, match=r"scripted backend cannot return sampling masks.*allow_missing"):
        _run(backend, CallOptions(sampling=TOP_P), qwen3_tokenizer)
    assert backend.requests == []  # refused before any request


def test_allow_missing_records_no_kept_set_with_its_reason(qwen3_tokenizer) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, ["hello"], sampling_masks=False)
    options = CallOptions(sampling=TOP_P, sampling_masks="allow_missing")
    rollout, (done,) = _run(backend, options, qwen3_tokenizer)
    turn = rollout.trajectory.turns[0]
    assert turn.sampling_mask is None and not backend.requests[0].return_sampling_mask
    assert turn.sampling_mask_missing is not None and turn.sampling_mask_missing.startswith("no kept set")
    assert done.sampling_mask_missing == turn.sampling_mask_missing


class _BadMask(ScriptedBackend):
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await super().generate(request)
        rows = [[t + 1] for t in result.output_ids]  # never the sampled token
        return msgspec.structs.replace(result, sampling_mask=SamplingMask.from_rows(rows))


def test_a_mask_without_the_sampled_token_is_refused_before_recording(qwen3_tokenizer) -> None:
    rollout = None
    with pytest.raises(BackendResponseError, match="not in its own kept set"):
        rollout, _ = _run(_BadMask(qwen3_tokenizer, ["hello"]), CallOptions(sampling=TOP_P), qwen3_tokenizer)
    assert rollout is None


def test_routing_is_recorded_when_returned_and_its_loss_has_a_reason(qwen3_tokenizer) -> None:
    options = CallOptions(return_routed_experts=True)
    with_routing = ScriptedBackend(qwen3_tokenizer, ["hello"], routed_experts=(2, 2))
    rollout, (done,) = _run(with_routing, options, qwen3_tokenizer)
    routed = rollout.trajectory.routed_experts()
    assert routed is not None and done.routed_experts and done.routed_experts_missing is None
    data, shape = routed
    assert shape == (2, 2) and len(data) == (len(rollout.trajectory) - 1) * 16
    last = len(rollout.trajectory) - 2
    assert list(memoryview(data).cast("i")[last * 4 :]) == scripted_routing(last, (2, 2))

    stripped = ScriptedBackend(qwen3_tokenizer, ["hello"])  # answers without routing: a proxy dropped it
    rollout, (done,) = _run(stripped, options, qwen3_tokenizer)
    turn = rollout.trajectory.turns[0]
    assert turn.routed_experts is None and not done.routed_experts
    assert turn.routed_experts_missing is not None and "has none" in turn.routed_experts_missing


def test_the_strands_front_records_kept_sets_and_routing_through_an_agent(qwen3_tokenizer) -> None:
    from strands import Agent

    from tito_core import TitoModel

    backend = ScriptedBackend(qwen3_tokenizer, ["Four."], routed_experts=(1, 2))
    model = TitoModel(backend, qwen3_tokenizer, sampling=TOP_P, return_routed_experts=True)
    Agent(model=model, callback_handler=None)("2+2?")
    (turn,) = model.trajectory.turns
    assert turn.sampling_mask is not None and turn.sampling_mask.rows == turn.output_len
    assert model.trajectory.routed_experts() is not None

    refused = TitoModel(
        ScriptedBackend(qwen3_tokenizer, ["Four."], sampling_masks=False), qwen3_tokenizer, sampling=TOP_P
    )
    with pytest.raises(SamplingMaskError):
        Agent(model=refused, callback_handler=None)("2+2?")
    assert refused.trajectory.status == "failed"
